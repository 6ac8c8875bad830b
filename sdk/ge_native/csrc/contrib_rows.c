/* The row kernels of onnxruntime's contrib ops (domain com.microsoft, ge_native.contrib_rows), float32:
   the layer norms with a skip and a bias (SkipLayerNormalization, SkipSimplifiedLayerNormalization,
   SimplifiedLayerNormalization, EmbedLayerNormalization's norm) with their optional outputs,
   RotaryEmbedding over (batch, seq, heads) rows, and the GELU family (Gelu, BiasGelu, FastGelu,
   QuickGelu) with a bias along the last axis. Each row is computed alone (sums reassociated
   within it), so the results do not depend on the number of threads. */
#include "prelude.h"
#include "activations.h"

/* the even parts of `rows` rows of `cols` a kernel runs as tasks (fused_rows.c's split): about
   16K elements each, a multiple of *threads of them, one thread under 32K elements */
static int64_t cr_parts(int64_t rows, int64_t cols, int64_t *threads) {
    if (rows * cols < 32768) *threads = 1;
    int64_t blocks = (rows * cols + 16383) / 16384;
    if (*threads > 1) blocks = (blocks + *threads - 1) / *threads * *threads;
    if (blocks > rows) blocks = rows;
    return blocks < 1 ? 1 : blocks;
}

/* two float ranges [a, a + na) and [b, b + nb) share memory */
static int cr_overlap(const float *a, int64_t na, const float *b, int64_t nb) {
    return a < b + nb && b < a + na;
}

/* ---------------------------------------------------------------------------------------------
   norms: s = x + skip row (i % skip_rows) + bias; y = (s - mean) * inv * gamma + beta, or
   s * inv * gamma (simplified: inv = 1 / sqrt(mean(s^2) + eps)); the variance is onnxruntime's
   mean(s^2) - mean^2, or the two-pass mean((s - mean)^2) (EmbedLayerNormalization's) */
enum { CR_SKIP = 1, CR_BIAS = 2, CR_BETA = 4, CR_SUM = 8, CR_MEAN = 16, CR_INV = 32, CR_SIMPLE = 64, CR_TWOPASS = 128 };

typedef struct {
    const float *x, *skip, *bias, *gamma, *beta;
    float *out, *sum, *mean, *inv;
    float eps;
    int64_t flags, rows, cols, skip_rows, parts;
} NQ;

/* one pass: s = x + skip + bias stored into the row (and its sum output) while its sum and sum
   of squares add up (`#pragma omp simd`: element k reads and writes element k alone, the output
   may be the input itself) */
#define SUM_PASS(EXPR)                                                                                 \
    _Pragma("omp simd reduction(+:s, ss)")                                                          \
    for (int64_t k = 0; k < d; k++) { float t = EXPR; o[k] = t; sm[k] = t; s += t; ss += t * t; }

static void norm_row(const NQ *q, int64_t i) {
    int64_t d = q->cols, fl = q->flags;
    const float *x = q->x + i * d, *sk = (fl & CR_SKIP) ? q->skip + (i % q->skip_rows) * d : NULL;
    const float *bi = q->bias, *g = q->gamma, *be = q->beta;
    float *o = q->out + i * d, *sm = (fl & CR_SUM) ? q->sum + i * d : o;
    float s = 0, ss = 0, inv_d = 1.0f / (float)d;
    if (sk && (fl & CR_BIAS)) {
        SUM_PASS(x[k] + sk[k] + bi[k])
    } else if (sk) {
        SUM_PASS(x[k] + sk[k])
    } else if (fl & CR_BIAS) {
        SUM_PASS(x[k] + bi[k])
    } else {
        SUM_PASS(x[k])
    }
    float m = s * inv_d, var;
    if (fl & CR_SIMPLE) {
        var = ss * inv_d;
    } else if (fl & CR_TWOPASS) {
        float v = 0;
#pragma omp simd reduction(+:v)
        for (int64_t k = 0; k < d; k++) { float t = o[k] - m; v += t * t; }
        var = v * inv_d;
    } else {
        var = ss * inv_d - m * m;
    }
    float rs = 1.0f / sqrtf(var + q->eps);
    if (fl & CR_SIMPLE) {
#pragma omp simd
        for (int64_t k = 0; k < d; k++) o[k] = o[k] * rs * g[k];
    } else if (fl & CR_BETA) {
#pragma omp simd
        for (int64_t k = 0; k < d; k++) o[k] = (o[k] - m) * rs * g[k] + be[k];
    } else {
#pragma omp simd
        for (int64_t k = 0; k < d; k++) o[k] = (o[k] - m) * rs * g[k];
    }
    if (fl & CR_MEAN) q->mean[i] = m;
    if (fl & CR_INV) q->inv[i] = rs;
}

static void task_norm(void *vc, int64_t b, int slot) {
    const NQ *q = (const NQ *)vc;
    int64_t end = (b + 1) * q->rows / q->parts;
    (void)slot;
    for (int64_t i = b * q->rows / q->parts; i < end; i++) norm_row(q, i);
}

/* an output range `o` (n floats) and an input range `a` (na floats, NULL: none): the same memory
   exactly (in place, rows read before they are written) or apart */
static int cr_alias_ok(const float *o, int64_t n, const float *a, int64_t na) {
    return !a || (a == o && na == n) || !cr_overlap(o, n, a, na);
}

/* cr_norm(x, skip, bias, gamma, beta, out, sum, mean, inv, flags, eps, rows, cols, skip_rows,
   threads): x, out, sum (rows x cols), skip (skip_rows x cols), bias, gamma, beta (cols), mean and
   inv (rows); the arrays a flag leaves out are not read (any float32 array stands there). out and
   sum may each be x or skip itself, else apart from every other array */
static PyObject *cr_norm(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t flags, rows, cols, skip_rows, threads;
    if (ge_nargs(n, 15)) return NULL;
    if (ge_int(args, 9, 0, 255, &flags) || ge_int(args, 11, 0, 1LL << 40, &rows)
        || ge_int(args, 12, 1, 1LL << 40, &cols) || ge_int(args, 13, 1, 1LL << 40, &skip_rows)
        || ge_int(args, 14, 1, 4096, &threads)) return NULL;
    double eps = PyFloat_AsDouble(args[10]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    if ((flags & CR_SKIP) && rows % skip_rows) return ge_fail();
    int64_t size = ge_prod(rows, cols, 1, 1), ssize = (flags & CR_SKIP) ? ge_prod(skip_rows, cols, 1, 1) : 0;
    if (size < 0 || ssize < 0) return ge_fail();
    NQ q = {0};
    q.x = (const float *)ge_arr(args, 0, NPY_FLOAT, 0, size);
    if (!q.x) return NULL;
    if ((flags & CR_SKIP) && !(q.skip = (const float *)ge_arr(args, 1, NPY_FLOAT, 0, ssize))) return NULL;
    if ((flags & CR_BIAS) && !(q.bias = (const float *)ge_arr(args, 2, NPY_FLOAT, 0, cols))) return NULL;
    if (!(q.gamma = (const float *)ge_arr(args, 3, NPY_FLOAT, 0, cols))) return NULL;
    if ((flags & CR_BETA) && !(q.beta = (const float *)ge_arr(args, 4, NPY_FLOAT, 0, cols))) return NULL;
    if (!(q.out = (float *)ge_arr(args, 5, NPY_FLOAT, 1, size))) return NULL;
    if ((flags & CR_SUM) && !(q.sum = (float *)ge_arr(args, 6, NPY_FLOAT, 1, size))) return NULL;
    if ((flags & CR_MEAN) && !(q.mean = (float *)ge_arr(args, 7, NPY_FLOAT, 1, rows))) return NULL;
    if ((flags & CR_INV) && !(q.inv = (float *)ge_arr(args, 8, NPY_FLOAT, 1, rows))) return NULL;
    /* every output apart from the vectors and from each other; out and sum apart from x and skip
       unless they are that memory exactly */
    float *outs[4] = {q.out, q.sum, q.mean, q.inv};
    int64_t lens[4] = {size, size, rows, rows};
    const float *vecs[3] = {q.bias, q.gamma, q.beta};
    for (int a = 0; a < 4; a++) {
        if (!outs[a]) continue;
        for (int v = 0; v < 3; v++)
            if (vecs[v] && cr_overlap(outs[a], lens[a], vecs[v], cols)) return ge_fail();
        for (int b = a + 1; b < 4; b++)
            if (outs[b] && cr_overlap(outs[a], lens[a], outs[b], lens[b])) return ge_fail();
        if (a < 2 ? !cr_alias_ok(outs[a], size, q.x, size) || !cr_alias_ok(outs[a], size, q.skip, ssize)
                  : cr_overlap(outs[a], rows, q.x, size) || (q.skip && cr_overlap(outs[a], rows, q.skip, ssize)))
            return ge_fail();
    }
    q.eps = (float)eps; q.flags = flags; q.rows = rows; q.cols = cols; q.skip_rows = skip_rows;
    if (rows == 0) Py_RETURN_NONE;
    q.parts = cr_parts(rows, cols, &threads);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(task_norm, &q, q.parts, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
   rotary: row (b, s, h) of x, head size H, its first R (even) elements rotated by position p's
   cos and sin (cache rows of R / 2); the halves (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), or the
   pairs (x[2k], x[2k+1]) interleaved; elements R.. copied */
typedef struct {
    const float *x, *c, *s; const int64_t *pos; float *out;
    int64_t B, S, N, H, R, transposed, interleaved, pos_fmt, parts;
} RQ;

static void rot_row(const RQ *q, int64_t r) {
    int64_t n = r % q->N, s = (r / q->N) % q->S, b = r / q->N / q->S, H = q->H, h = q->R / 2;
    int64_t off = q->transposed ? ((b * q->N + n) * q->S + s) * H : ((b * q->S + s) * q->N + n) * H;
    int64_t p = q->pos_fmt ? q->pos[b * q->S + s] : q->pos[0] + s;
    const float *x = q->x + off, *c = q->c + p * h, *sn = q->s + p * h;
    float *o = q->out + off;
    if (q->interleaved) {
        for (int64_t k = 0; k < h; k++) {
            float a = x[2 * k], e = x[2 * k + 1];
            o[2 * k] = a * c[k] - e * sn[k];
            o[2 * k + 1] = e * c[k] + a * sn[k];
        }
    } else {
        for (int64_t k = 0; k < h; k++) {
            float a = x[k], e = x[k + h];
            o[k] = a * c[k] - e * sn[k];
            o[k + h] = e * c[k] + a * sn[k];
        }
    }
    if (o != x && q->R < H) memcpy(o + q->R, x + q->R, (size_t)(H - q->R) * sizeof(float));
}

static void task_rot(void *vc, int64_t t, int slot) {
    const RQ *q = (const RQ *)vc;
    int64_t rows = q->B * q->S * q->N, end = (t + 1) * rows / q->parts;
    (void)slot;
    for (int64_t r = t * rows / q->parts; r < end; r++) rot_row(q, r);
}

/* cr_rotary(x, pos, cos, sin, out, B, S, N, H, R, transposed, interleaved, pos_fmt, threads):
   x and out (B * S * N * H floats, (B, S, N, H) or transposed (B, N, S, H)), out x itself or
   apart; cos and sin 2-D (max positions, R / 2); pos int64: pos_fmt 0, one offset (position
   pos[0] + s), 1: (B, S) positions; every position checked in [0, max positions) first */
static PyObject *cr_rotary(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    RQ q = {0};
    int64_t threads, mp, half, mp2, half2;
    if (ge_nargs(n, 14)) return NULL;
    if (ge_int(args, 5, 0, 1LL << 40, &q.B) || ge_int(args, 6, 0, 1LL << 40, &q.S)
        || ge_int(args, 7, 1, 1LL << 40, &q.N) || ge_int(args, 8, 2, 1LL << 40, &q.H)
        || ge_int(args, 9, 2, 1LL << 40, &q.R) || ge_int(args, 10, 0, 1, &q.transposed)
        || ge_int(args, 11, 0, 1, &q.interleaved) || ge_int(args, 12, 0, 1, &q.pos_fmt)
        || ge_int(args, 13, 1, 4096, &threads)) return NULL;
    if (q.R % 2 || q.R > q.H) return ge_fail();
    int64_t size = ge_prod(q.B, q.S, q.N, q.H), np_ = q.pos_fmt ? ge_prod(q.B, q.S, 1, 1) : 1;
    if (size < 0 || np_ < 0) return ge_fail();
    q.x = (const float *)ge_arr(args, 0, NPY_FLOAT, 0, size);
    q.pos = q.x ? (const int64_t *)ge_arr(args, 1, NPY_INT64, 0, np_) : NULL;
    q.c = q.pos ? (const float *)ge_mat(args, 2, NPY_FLOAT, 0, &mp, &half) : NULL;
    q.s = q.c ? (const float *)ge_mat(args, 3, NPY_FLOAT, 0, &mp2, &half2) : NULL;
    q.out = q.s ? (float *)ge_arr(args, 4, NPY_FLOAT, 1, size) : NULL;
    if (!q.out) return NULL;
    if (mp != mp2 || half != half2 || half != q.R / 2) return ge_fail();
    if (q.out != q.x && cr_overlap(q.out, size, q.x, size)) return ge_fail();
    if (cr_overlap(q.out, size, q.c, mp * half) || cr_overlap(q.out, size, q.s, mp * half)) return ge_fail();
    if (size == 0) Py_RETURN_NONE;
    /* the positions: each row's cache row lies inside cos and sin */
    for (int64_t i = 0; i < np_; i++) {
        int64_t p = q.pos[i];
        if (p < 0 || p >= mp || (!q.pos_fmt && q.S > mp - p)) {
            PyErr_Format(PyExc_IndexError, "rotary: position %lld%s is outside the cos/sin cache of %lld positions",
                         (long long)p, q.pos_fmt ? "" : " + sequence length", (long long)mp);
            return NULL;
        }
    }
    q.parts = cr_parts(q.B * q.S * q.N, q.H, &threads);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(task_rot, &q, q.parts, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
   the GELU family on x + bias (bias along the last axis, cols): kind 0 erf's GELU (Gelu,
   BiasGelu), 1 tanh's (FastGelu), 2 x * sigmoid(alpha x) (QuickGelu) */
typedef struct { const float *x, *bias; float *out; float alpha; int64_t kind, rows, cols, parts; } AQ;

static void task_act(void *vc, int64_t t, int slot) {
    const AQ *q = (const AQ *)vc;
    int64_t d = q->cols, end = (t + 1) * q->rows / q->parts;
    float al = q->alpha;
    (void)slot;
    for (int64_t i = t * q->rows / q->parts; i < end; i++) {
        const float *x = q->x + i * d, *bi = q->bias;
        float *o = q->out + i * d;
        if (q->kind == 0) {
#pragma omp simd
            for (int64_t k = 0; k < d; k++) o[k] = act_gelu32(bi ? x[k] + bi[k] : x[k]);
        } else if (q->kind == 1) {
#pragma omp simd
            for (int64_t k = 0; k < d; k++) o[k] = act_gelu_tanh32(bi ? x[k] + bi[k] : x[k]);
        } else {
#pragma omp simd
            for (int64_t k = 0; k < d; k++) {
                float v = bi ? x[k] + bi[k] : x[k];
                o[k] = v * act_sigmoid32(al * v);
            }
        }
    }
}

/* cr_act(x, bias, out, kind, alpha, rows, cols, has_bias, threads): x and out (rows x cols), out
   x itself or apart; bias (cols) read when has_bias */
static PyObject *cr_act(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    AQ q = {0};
    int64_t has_bias, threads;
    if (ge_nargs(n, 9)) return NULL;
    if (ge_int(args, 3, 0, 2, &q.kind) || ge_int(args, 5, 0, 1LL << 40, &q.rows)
        || ge_int(args, 6, 1, 1LL << 40, &q.cols) || ge_int(args, 7, 0, 1, &has_bias)
        || ge_int(args, 8, 1, 4096, &threads)) return NULL;
    double alpha = PyFloat_AsDouble(args[4]);
    if (alpha == -1.0 && PyErr_Occurred()) return NULL;
    int64_t size = ge_prod(q.rows, q.cols, 1, 1);
    if (size < 0) return ge_fail();
    q.x = (const float *)ge_arr(args, 0, NPY_FLOAT, 0, size);
    if (!q.x) return NULL;
    if (has_bias && !(q.bias = (const float *)ge_arr(args, 1, NPY_FLOAT, 0, q.cols))) return NULL;
    if (!(q.out = (float *)ge_arr(args, 2, NPY_FLOAT, 1, size))) return NULL;
    if (q.out != q.x && cr_overlap(q.out, size, q.x, size)) return ge_fail();
    if (q.bias && cr_overlap(q.out, size, q.bias, q.cols)) return ge_fail();
    q.alpha = (float)alpha;
    if (size == 0) Py_RETURN_NONE;
    q.parts = cr_parts(q.rows, q.cols, &threads);
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(task_act, &q, q.parts, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *cr_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) { return PyLong_FromLong(1); }
