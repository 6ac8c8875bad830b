#include "prelude.h"
#include "activations16.h"
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#define SG_NR 32
#define SG_MR 12
#define SG_MC 96
#define SG_PBLOCK ((int64_t)1 << 16)  /* floats of B a task's row tiles share (256 KB) */
#define SG_CONV_SCRATCH ((int64_t)1 << 22)
#define SG_CONV_CHUNK ((int64_t)1 << 18)
#define SG_PACK_KW 128  /* the widest kernel the vector pack takes (wav2vec2's positional conv) */

/* the tiles: AVX-512F (12 x 32: 24 registers of sums), or AVX2 with FMA (each 12 x 32 tile as
   four of 6 x 16: 12 of its 16 registers; the same sums in the same order) */
#if defined(__AVX512F__)
#define SG_VEC 2
#elif defined(__AVX2__) && defined(__FMA__)
#define SG_VEC 1
#endif

static int64_t sg_isa(void) {
#if defined(SG_VEC)
    return 1;
#else
    return 0;
#endif
}

/* the instruction set of the tiles: 2 AVX-512F, 1 AVX2 + FMA, 0 none */
static PyObject *sg_width(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
#if defined(SG_VEC)
    return PyLong_FromLongLong(SG_VEC);
#else
    return PyLong_FromLongLong(0);
#endif
}

static PyObject *sg_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
    return PyLong_FromLongLong(sg_isa());
}

typedef struct {
    const float *a; int64_t lda;         /* A (m, k): a[r * lda + kk] */
    const float *b;                      /* B packed: panel p (k, 32) at b + p * k * 32 */
    float *c; int64_t ldc;
    int64_t m, n, k;
    const float *bias; int64_t bias_kind; /* 0 none, 1 per column (n values), 2 per row (m values) */
    const float *z; int64_t has_z;        /* an addend of C's shape (a residual), or none */
    int64_t clip; float lo, hi;
    int64_t act;                          /* then 0 none, 1 sigmoid, 2 silu, 3 gelu, 4 gelu (tanh), 5 hardswish */
    int64_t row_blocks, groups, per_group, panels;
    int64_t cgroups;                      /* a grouped convolution's groups: A, B, C (and a row bias,
                                             Z) of group g start g * m rows (B: g * panels) on */
    int64_t apack;                        /* A is packed (RowPanels): per group ceil(m / 12) blocks of
                                             (k, 12), row r0's block at a + (r0 / 12) * k * 12 */
    int64_t ldb;                          /* 0: B packed in panels; else B read in place, row kk of
                                             panel p at b + kk * ldb + p * 32 (a 1x1 stride-1
                                             convolution's activation: channel kk's plane) */
    int64_t rowsplit;                     /* A is the activation: split rows first (see sg_exec) */
    int64_t parts;                        /* set by sg_exec: row blocks are the rows' even parts */
} sg_ctx;

#if defined(__AVX512F__)
/* the epilogue of one row of a tile, then its store: + the bias (per column: bc0/bc1; per row:
   its value), + the addend's row, the clip to [lo, hi], the activation `act` (the caller passes
   q->act, or 0 where it knows there is none) */
static inline __attribute__((always_inline)) void sg_store_row(const sg_ctx *q, int64_t row, int64_t j0, __m512 y0,
                                                               __m512 y1, __m512 bc0, __m512 bc1, __m512 lo, __m512 hi,
                                                               __mmask16 m0, __mmask16 m1, int64_t act, const int half) {
    if (q->bias_kind == 1) { y0 = _mm512_add_ps(y0, bc0); y1 = _mm512_add_ps(y1, bc1); }
    else if (q->bias_kind == 2) {
        __m512 br = _mm512_set1_ps(q->bias[row]);
        y0 = _mm512_add_ps(y0, br); y1 = _mm512_add_ps(y1, br);
    }
    if (q->has_z) {
        const float *zr = q->z + row * q->ldc + j0;
        y0 = _mm512_add_ps(y0, _mm512_maskz_loadu_ps(m0, zr));
        y1 = _mm512_add_ps(y1, _mm512_maskz_loadu_ps(m1, zr + 16));
    }
    if (q->clip) {
        y0 = _mm512_min_ps(_mm512_max_ps(y0, lo), hi);
        y1 = _mm512_min_ps(_mm512_max_ps(y1, lo), hi);
    }
    if (act) {
        y0 = sg_act16(y0, act);
        if (!half) y1 = sg_act16(y1, act);
    }
    float *cr = q->c + row * q->ldc + j0;
    _mm512_mask_storeu_ps(cr, m0, y0);
    if (!half) _mm512_mask_storeu_ps(cr + 16, m1, y1);
}

/* half: the panel's last 16 columns are past n (a tail of 16 or fewer): its second half is
   neither multiplied nor stored */
static inline __attribute__((always_inline)) void sg_tile_(const sg_ctx *q, int mr, int64_t r0, int64_t j0, int pk,
                                                           int pf, const int half, const int ip) {
    __m512 c0[SG_MR], c1[SG_MR];
    for (int r = 0; r < SG_MR; r++) { c0[r] = _mm512_setzero_ps(); c1[r] = _mm512_setzero_ps(); }
    int64_t w = q->n - j0 < SG_NR ? q->n - j0 : SG_NR;
    __mmask16 m0 = w >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << w) - 1u);
    __mmask16 m1 = w >= 32 ? (__mmask16)0xffff : w <= 16 ? (__mmask16)0 : (__mmask16)((1u << (w - 16)) - 1u);
    /* A in place (row r, column kk at a[r * lda + kk]) or packed (one sequential stream of 12
       values per kk: the const weight's block, laid out at build time) */
    int64_t k = q->k;
    const float *a = pk ? q->a + (r0 / SG_MR) * k * SG_MR : q->a + r0 * q->lda;
    int64_t rs = pk ? 1 : q->lda, ks = pk ? SG_MR : 1;
    /* B: the packed panel (k steps of 32), or in place (ip: k rows ldb apart, the tail masked) */
    const float *bp = ip ? q->b + j0 : q->b + (j0 / SG_NR) * k * SG_NR;
    const int64_t ldb = ip ? q->ldb : SG_NR;
    /* in place: the last row whose whole load (16 or 32 floats from column j0) ends inside the
       group's k rows of B; -1 when none does */
    const int64_t span = k * ldb - j0 - (half ? 16 : SG_NR);
    const int64_t safe_max = ip == 2 ? (span >= 0 ? span / ldb : -1) : k;
    int64_t bleft = (q->panels - j0 / SG_NR) * k;  /* B's steps from this panel's on (the next panel follows it) */
    /* the tile's 12 output rows are 12 lines apart by a row of C: fetched (for writing) now, while
       the k loop runs, instead of one miss per store after it (a model's outputs are not in the
       cache; these misses were most of a small-k layer's time there) */
    for (int r = 0; r < mr; r++) {
        const char *cl = (const char *)(q->c + (r0 + r) * q->ldc + j0);
        _mm_prefetch(cl, _MM_HINT_ET0);
        _mm_prefetch(cl + 64, _MM_HINT_ET0);
        if (q->has_z) {
            const char *zl = (const char *)(q->z + (r0 + r) * q->ldc + j0);
            _mm_prefetch(zl, _MM_HINT_T0);
            _mm_prefetch(zl + 64, _MM_HINT_T0);
        }
    }
    for (int64_t kk = 0; kk < k; kk++) {
        /* the packed weight's stream, 32 steps ahead (never past its end): a large-k layer's weight
           comes from memory (512 x 4608 at 7x7: 40 -> 55 GFLOP/s) */
        if (pk && kk + 32 < k) _mm_prefetch((const char *)(a + (kk + 32) * SG_MR), _MM_HINT_T0);
        /* the first row tile of a panel reads it from memory (a model's weights are not in the
           cache): its stream 32 steps ahead, which the hardware prefetcher alone did not keep up
           with (GPT-2's 768 x 3072 fc: 90 -> 100 GFLOP/s, a 50-row 3072 x 768 one 77 -> 92), on
           into the next panel, which this tile's row reads next; the later tiles find it in L2 */
        if (!ip && pf && kk + 32 < bleft) {
            _mm_prefetch((const char *)(bp + (kk + 32) * SG_NR), _MM_HINT_T0);
            if (!half) _mm_prefetch((const char *)(bp + (kk + 32) * SG_NR + 16), _MM_HINT_T0);
        }
        /* in place, the first row tile brings the rows in: 8 ahead, one stream per row */
        if (ip && pf && kk + 8 < k) {
            _mm_prefetch((const char *)(bp + (kk + 8) * ldb), _MM_HINT_T0);
            if (!half) _mm_prefetch((const char *)(bp + (kk + 8) * ldb + 16), _MM_HINT_T0);
        }
        /* a tail panel in place (ip 2) reads past its row's end into the rows after it (its lanes
           past n are never stored) while the load ends inside the group's k rows; the rows whose
           load would not (the last, or more on a plane narrower than the load) are masked
           (masked loads across lines ran at a third of the speed) */
        const int last = ip == 2 && kk > safe_max;
        __m512 b0 = last ? _mm512_maskz_loadu_ps(m0, bp + kk * ldb) : _mm512_loadu_ps(bp + kk * ldb);
        __m512 b1 = half ? b0 : last ? _mm512_maskz_loadu_ps(m1, bp + kk * ldb + 16)
                                     : _mm512_loadu_ps(bp + kk * ldb + 16);
        for (int r = 0; r < SG_MR; r++) {
            if (r < mr) {
                __m512 x = _mm512_set1_ps(a[r * rs + kk * ks]);
                c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
                if (!half) c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
            }
        }
    }
    __m512 bc0 = _mm512_setzero_ps(), bc1 = _mm512_setzero_ps();
    if (q->bias_kind == 1) {
        bc0 = _mm512_maskz_loadu_ps(m0, q->bias + j0);
        bc1 = _mm512_maskz_loadu_ps(m1, q->bias + j0 + 16);
    }
    __m512 lo = _mm512_set1_ps(q->lo), hi = _mm512_set1_ps(q->hi);
    if (!q->act && mr == SG_MR) {
        /* a whole tile without an activation (bias, residual, ReLU or ReLU6: most convolutions and
           linear layers): the rows unrolled, so the 24 sums are stored from their registers (a
           loop over r indexes them, which made the compiler spill all of them to the stack:
           small-k 1x1 convolutions 0-8% slower); act 0 here folds the activation away */
#pragma GCC unroll 12
        for (int r = 0; r < SG_MR; r++) sg_store_row(q, r0 + r, j0, c0[r], c1[r], bc0, bc1, lo, hi, m0, m1, 0, half);
        return;
    }
    for (int r = 0; r < mr; r++) sg_store_row(q, r0 + r, j0, c0[r], c1[r], bc0, bc1, lo, hi, m0, m1, q->act, half);
}

static inline __attribute__((always_inline)) void sg_tile(const sg_ctx *q, int mr, int64_t r0, int64_t j0, int pf) {
    /* a tail of 16 columns or fewer: half the multiply-adds (a 14x14 plane is 6 panels and 4
       columns: 1/8 of the products were of padding) */
    if (q->ldb) {  /* B in place: a convolution's (A packed or not); the tail's rows masked */
        if (q->n - j0 <= 16) {
            if (q->apack) sg_tile_(q, mr, r0, j0, 1, pf, 1, 2);
            else sg_tile_(q, mr, r0, j0, 0, pf, 1, 2);
        } else if (q->n - j0 < 32) {
            if (q->apack) sg_tile_(q, mr, r0, j0, 1, pf, 0, 2);
            else sg_tile_(q, mr, r0, j0, 0, pf, 0, 2);
        } else if (q->apack) sg_tile_(q, mr, r0, j0, 1, pf, 0, 1);
        else sg_tile_(q, mr, r0, j0, 0, pf, 0, 1);
        return;
    }
    if (q->n - j0 <= 16) {
        if (q->apack) sg_tile_(q, mr, r0, j0, 1, 0, 1, 0);
        else sg_tile_(q, mr, r0, j0, 0, pf, 1, 0);
        return;
    }
    if (q->apack) sg_tile_(q, mr, r0, j0, 1, 0, 0, 0);  /* (B is the call's own packed activation: in the cache) */
    else if (pf) sg_tile_(q, mr, r0, j0, 0, 1, 0, 0);
    else sg_tile_(q, mr, r0, j0, 0, 0, 0, 0);
}
#elif defined(SG_VEC)
/* AVX2: sg_store_row's epilogue on 16 columns as two 8-lane halves; w: the columns left (the
   rest masked) */
static inline __attribute__((always_inline)) void sg8_store_row(const sg_ctx *q, int64_t row, int64_t j0, __m256 y0,
                                                                __m256 y1, __m256 bc0, __m256 bc1, __m256 lo, __m256 hi,
                                                                __m256i m0, __m256i m1, int full, int64_t act) {
    if (q->bias_kind == 1) { y0 = _mm256_add_ps(y0, bc0); y1 = _mm256_add_ps(y1, bc1); }
    else if (q->bias_kind == 2) {
        __m256 br = _mm256_set1_ps(q->bias[row]);
        y0 = _mm256_add_ps(y0, br); y1 = _mm256_add_ps(y1, br);
    }
    if (q->has_z) {
        const float *zr = q->z + row * q->ldc + j0;
        if (full) { y0 = _mm256_add_ps(y0, _mm256_loadu_ps(zr)); y1 = _mm256_add_ps(y1, _mm256_loadu_ps(zr + 8)); }
        else { y0 = _mm256_add_ps(y0, _mm256_maskload_ps(zr, m0)); y1 = _mm256_add_ps(y1, _mm256_maskload_ps(zr + 8, m1)); }
    }
    if (q->clip) {
        y0 = _mm256_min_ps(_mm256_max_ps(y0, lo), hi);
        y1 = _mm256_min_ps(_mm256_max_ps(y1, lo), hi);
    }
    if (act) {
        y0 = sg_act8(y0, act);
        y1 = sg_act8(y1, act);
    }
    float *cr = q->c + row * q->ldc + j0;
    if (full) { _mm256_storeu_ps(cr, y0); _mm256_storeu_ps(cr + 8, y1); }
    else { _mm256_maskstore_ps(cr, m0, y0); _mm256_maskstore_ps(cr + 8, m1, y1); }
}

/* rows [r0, r0 + mr) (mr <= 6) times the 16 columns j0 ... of half h of a panel */
static inline __attribute__((always_inline)) void sg8_tile_(const sg_ctx *q, int mr, int64_t r0, int64_t j0, int h,
                                                            int pk, int pf) {
    __m256 c0[6], c1[6];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) { c0[r] = _mm256_setzero_ps(); c1[r] = _mm256_setzero_ps(); }
    int64_t w = q->n - j0 < 16 ? q->n - j0 : 16;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w), lane);
    __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w - 8), lane);
    int full = w == 16;
    int64_t k = q->k;
    const float *a = pk ? q->a + (r0 / SG_MR) * k * SG_MR + r0 % SG_MR : q->a + r0 * q->lda;
    int64_t rs = pk ? 1 : q->lda, ks = pk ? SG_MR : 1;
    const float *bp = q->b + ((j0 - h * 16) / SG_NR) * k * SG_NR + h * 16;
    int64_t bleft = (q->panels - j0 / SG_NR) * k;
    for (int64_t kk = 0; kk < k; kk++) {
        if (pk && kk + 32 < k) _mm_prefetch((const char *)(a + (kk + 32) * SG_MR), _MM_HINT_T0);
        if (pf && kk + 32 < bleft) _mm_prefetch((const char *)(bp + (kk + 32) * SG_NR), _MM_HINT_T0);
        __m256 b0 = _mm256_loadu_ps(bp + kk * SG_NR), b1 = _mm256_loadu_ps(bp + kk * SG_NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            if (r < mr) {
                __m256 x = _mm256_broadcast_ss(a + r * rs + kk * ks);
                c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
                c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
            }
        }
    }
    __m256 bc0 = _mm256_setzero_ps(), bc1 = _mm256_setzero_ps();
    if (q->bias_kind == 1) {
        bc0 = _mm256_maskload_ps(q->bias + j0, m0);
        bc1 = _mm256_maskload_ps(q->bias + j0 + 8, m1);
    }
    __m256 lo = _mm256_set1_ps(q->lo), hi = _mm256_set1_ps(q->hi);
    if (!q->act && mr == 6) {
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) sg8_store_row(q, r0 + r, j0, c0[r], c1[r], bc0, bc1, lo, hi, m0, m1, full, 0);
        return;
    }
    /* (every index a constant: a loop to mr indexing the sums made the compiler keep all of them
       on the stack, stored at every step of k: a third of the speed) */
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
        if (r < mr) sg8_store_row(q, r0 + r, j0, c0[r], c1[r], bc0, bc1, lo, hi, m0, m1, full, q->act);
}

static inline __attribute__((always_inline)) void sg8_tile(const sg_ctx *q, int mr, int64_t r0, int64_t j0, int h,
                                                           int pf) {
    if (q->apack) { if (mr == 6) sg8_tile_(q, 6, r0, j0, h, 1, 0); else sg8_tile_(q, mr, r0, j0, h, 1, 0); }
    else if (pf) { if (mr == 6) sg8_tile_(q, 6, r0, j0, h, 0, 1); else sg8_tile_(q, mr, r0, j0, h, 0, 1); }
    else if (mr == 6) sg8_tile_(q, 6, r0, j0, h, 0, 0);
    else sg8_tile_(q, mr, r0, j0, h, 0, 0);
}

/* the 12 x 32 tile at (r0, j0) as its 6 x 16 quarters: each half of the panel for both row halves
   in turn (the half's B lines in L1 for the second) */
static void sg_tile(const sg_ctx *q, int mr, int64_t r0, int64_t j0, int pf) {
    for (int h = 0; h < 2 && j0 + h * 16 < q->n; h++)
        for (int r = 0; r < mr; r += 6) sg8_tile(q, mr - r < 6 ? mr - r : 6, r0 + r, j0 + h * 16, h, pf && r == 0);
}
#endif

#if defined(SG_VEC)

/* task i: rows [rb * MC, +MC) times panels [g * per_group, +per_group), panel group outer; with
   q->parts, row part rb = i / groups of the row_blocks even parts, panel group g = i % groups */
static void sg_task(void *vc, int64_t i, int slot) {
    const sg_ctx *q0 = (const sg_ctx *)vc;
    (void)slot;
    int64_t per = q0->row_blocks * q0->groups, cg = i / per;
    sg_ctx l = *q0;
    const sg_ctx *q = &l;
    if (cg > 0) {
        l.a += l.apack ? cg * ((l.m + SG_MR - 1) / SG_MR) * SG_MR * l.k : cg * l.m * l.lda;
        l.b += cg * (l.ldb ? l.k * l.ldb : l.panels * l.k * SG_NR);
        l.c += cg * l.m * l.ldc;
        if (l.bias_kind == 2) l.bias += cg * l.m;
        if (l.z) l.z += cg * l.m * l.ldc;
    }
    i -= cg * per;
    int64_t rb, g, r_lo, r_hi;
    if (q->parts) {
        rb = i / q->groups; g = i % q->groups;
        r_lo = rb * q->m / q->row_blocks; r_hi = (rb + 1) * q->m / q->row_blocks;
    } else {
        rb = i % q->row_blocks; g = i / q->row_blocks;
        r_lo = rb * SG_MC; r_hi = r_lo + SG_MC < q->m ? r_lo + SG_MC : q->m;
    }
    int64_t p_lo = g * q->per_group, p_hi = p_lo + q->per_group < q->panels ? p_lo + q->per_group : q->panels;
    /* panels in blocks of about SG_PBLOCK floats of B (kept in L2 while every row tile reads
       them), each row tile sweeping the block: a tile's 12 rows of C are then written as 12 long
       runs, not 96 rows 128 bytes at a time, which the store prefetch cannot follow (a small-k
       layer with a large output, a 1x1 expansion on a 56x56 plane, ran at a third of BLAS's
       speed); a large-k layer's block is one panel, the panel-outer order it had */
    int64_t pb = SG_PBLOCK / ((q->k > 0 ? q->k : 1) * SG_NR);
    if (pb < 1 || q->ldb) pb = 1;  /* B in place: one panel (k rows of 32 columns, in L1) for every row tile */
    for (int64_t pp = p_lo; pp < p_hi; pp += pb) {
        int64_t pe = pp + pb < p_hi ? pp + pb : p_hi;
        for (int64_t r = r_lo; r < r_hi; r += SG_MR) {
            int64_t mr = r_hi - r < SG_MR ? r_hi - r : SG_MR;
            int pf = r == r_lo;  /* the first row tile brings each panel of the block in */
            for (int64_t p = pp; p < pe; p++) {
                if (mr == SG_MR) sg_tile(q, SG_MR, r, p * SG_NR, pf);
                else sg_tile(q, (int)mr, r, p * SG_NR, pf);
            }
        }
    }
}
#endif

/* the task grid for `width` threads, then the run (without the GIL) */
static void sg_exec(sg_ctx *q, int64_t width) {
#if defined(SG_VEC)
    /* an empty extent first: nothing to compute (m or n of 0 made the task grid divide by 0) */
    if (q->m <= 0 || q->n <= 0) return;
    q->panels = (q->n + SG_NR - 1) / SG_NR;
    q->row_blocks = (q->m + SG_MC - 1) / SG_MC;
    if (q->cgroups < 1) q->cgroups = 1;
    int64_t want = width > 1 ? 4 * width : 1;  /* a few tasks per thread: claimed as threads come free */
    /* A the activation (a linear layer's x @ W) with rows for two tiles a thread: the rows in
       `width` even parts, row-major tasks (each part's groups of panels in turn), so the pool's
       participant s starts on rows [s * m / width, (s + 1) * m / width): the rows the row kernels
       (LayerNorm, softmax) and the previous GEMM gave it, still in its core's cache. Split by
       panels, each thread read all of A, half of it from the other core (DeiT-tiny at 2
       threads, ge/ORT 1.11-1.19 -> 1.06-1.08) */
    q->parts = q->rowsplit && width > 1 && q->cgroups == 1 && q->m >= 2 * SG_MR * width;
    if (q->parts) q->row_blocks = width;
    int64_t groups = want / (q->row_blocks * q->cgroups);
    if (groups < 1) groups = 1;
    if (groups > q->panels) groups = q->panels;
    q->per_group = (q->panels + groups - 1) / groups;
    q->groups = (q->panels + q->per_group - 1) / q->per_group;
    if (q->m > 0 && q->n > 0) ge_parallel(sg_task, q, q->cgroups * q->row_blocks * q->groups, width);
#else
    (void)q; (void)width;
#endif
}

/* the shared end of the GEMM entries */
static PyObject *sg_run(sg_ctx *q, int64_t width) {
#if defined(SG_VEC)
    Py_BEGIN_ALLOW_THREADS
    sg_exec(q, width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    (void)q; (void)width;
    PyErr_SetString(PyExc_RuntimeError, "sgemm: built without AVX-512 or AVX2");
    return NULL;
#endif
}

/* the calling thread's scratch buffer of at least `count` floats, or NULL: kept for the thread's
   next call, it grows to the largest activation the thread packs (the engine's threads live as
   long as the process) */
static __thread float *sg_buf = NULL;
static __thread size_t sg_cap = 0;
static float *sg_scratch(size_t count) {
    if (count == 0) count = 1;  /* (an empty extent's scratch: a buffer all the same, not NULL) */
    if (count > sg_cap) {
        free(sg_buf);
        /* 64-byte aligned: a panel row is two whole cache lines (a load across two costs twice) */
        sg_buf = (float *)aligned_alloc(64, ((count * sizeof(float) + 63) / 64) * 64);
        sg_cap = sg_buf ? count : 0;
    }
    return sg_buf;
}

/* the epilogue's arguments, shared by both entries: bias (3; bias_len values when q->bias_kind),
   lo and hi (6, 7), the addend Z or None (9: m * n values), the activation (10); 0, or -1 with
   a Python exception */
static int sg_epilogue(PyObject *const *args, sg_ctx *q, int64_t bias_len) {
    q->bias = (const float *)ge_arr(args, 3, NPY_FLOAT, 0, q->bias_kind ? bias_len : 0);
    if (!q->bias) return -1;
    double lo = PyFloat_AsDouble(args[6]), hi = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred()) return -1;
    q->lo = (float)lo;
    q->hi = (float)hi;
    q->z = args[9] == Py_None ? NULL : (const float *)ge_arr(args, 9, NPY_FLOAT, 0, q->m * q->n);
    if (args[9] != Py_None && !q->z) return -1;
    q->has_z = q->z != NULL;
    return ge_int(args, 10, 0, 5, &q->act);
}

/* C (m, n) = A (m, k) @ panels (P, k, 32) [+ bias per column] [clipped]; the arguments are
   (A, panels, C, bias, bias_kind 0|1, clip 0|1, lo, hi, threads, Z or None, act 0..5) */
static PyObject *sg_packed(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t m, k, mc, nc, kind, clip, width, dims[3];
    if (ge_nargs(n, 11)) return NULL;
    if (ge_int(args, 4, 0, 1, &kind) || ge_int(args, 5, 0, 1, &clip) || ge_int(args, 8, 1, 4096, &width)) return NULL;
    const float *a = (const float *)ge_mat(args, 0, NPY_FLOAT, 0, &m, &k);
    const float *b = a ? (const float *)ge_nd(args, 1, NPY_FLOAT, 0, 3, dims) : NULL;
    float *c = b ? (float *)ge_mat(args, 2, NPY_FLOAT, 1, &mc, &nc) : NULL;
    if (!c) return NULL;
    if (mc != m || dims[1] != k || dims[2] != SG_NR || dims[0] != (nc + SG_NR - 1) / SG_NR) return ge_fail();
    sg_ctx q = {a, k, b, c, nc, m, nc, k, NULL, kind, NULL, 0, clip, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0};
    if (sg_epilogue(args, &q, nc)) return NULL;
    return sg_run(&q, width);
}

/* a convolution's column matrix, packed straight into panels: group g, panel p holds rows
   (c, ky, kx) of the group's channels times 32 output pixels; a read outside the image is 0 */
typedef struct {
    const float *x; float *bp;
    int64_t cg, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, n, k, panels;
    int64_t p0;                           /* the chunk's first panel: it packs panels [p0, p0 + panels) */
} sg_im2col;

#if defined(__AVX512F__)
/* the 16 elements two loads bring for 8 lanes at stride 2: lane t of `lanes8` (its low 8 bits)
   reads element 2t */
static inline __mmask16 sg_even(uint32_t lanes8) {
    uint32_t e = lanes8 & 0xffu;
    e = (e | (e << 4)) & 0x0f0fu;
    e = (e | (e << 2)) & 0x3333u;
    e = (e | (e << 1)) & 0x5555u;
    return (__mmask16)e;
}
#endif

static void sg_pack_task(void *vc, int64_t i, int slot) {
    const sg_im2col *q = (const sg_im2col *)vc;
    (void)slot;
    int64_t g = i / q->panels, p = i % q->panels;
    float *dst = q->bp + (g * q->panels + p) * q->k * SG_NR;
    if (q->kh == 1 && q->kw == 1 && q->sh == 1 && q->sw == 1 && q->pt == 0 && q->pl == 0 && q->oh == q->h
        && q->ow == q->w) {
        /* a 1x1 stride-1 convolution (W @ B): the panel is 32 columns of each channel's plane */
        int64_t j0 = (q->p0 + p) * SG_NR, w = q->n - j0 < SG_NR ? q->n - j0 : SG_NR;
        const float *src = q->x + g * q->cg * q->h * q->w + j0;
        for (int64_t c = 0; c < q->cg; c++) {
            /* each channel is its own stream (too many for the hardware prefetcher): the lines
               of the panel four ahead fetched now */
            _mm_prefetch((const char *)(src + c * q->n + 4 * SG_NR), _MM_HINT_T0);
            _mm_prefetch((const char *)(src + c * q->n + 4 * SG_NR + 16), _MM_HINT_T0);
            memcpy(dst + c * SG_NR, src + c * q->n, (size_t)w * sizeof(float));
            if (w < SG_NR) memset(dst + c * SG_NR + w, 0, (size_t)(SG_NR - w) * sizeof(float));
        }
        return;
    }
    /* the panel's 32 pixels as runs along output rows: run r covers columns [js[r], js[r+1])
       of output row oy[r], starting at output column ox[r] */
    int64_t js[SG_NR + 1], oys[SG_NR], oxs[SG_NR], runs = 0;
    int64_t pix = (q->p0 + p) * SG_NR, base = pix, end = pix + SG_NR < q->n ? pix + SG_NR : q->n;
    while (pix < end) {
        int64_t oy = pix / q->ow, ox = pix % q->ow;
        int64_t len = q->ow - ox < end - pix ? q->ow - ox : end - pix;
        js[runs] = pix - base; oys[runs] = oy; oxs[runs] = ox;
        runs++;
        pix += len;
    }
    js[runs] = end - base;
#if defined(__AVX512F__)
    if (q->kh <= 16 && q->kw <= SG_PACK_KW && q->sw <= ((int64_t)1 << 26)) {
        /* each run's in-image columns are one masked load per 16 lanes at stride 1 (stride 2:
           two, then the even elements picked; a larger stride: a masked gather); a panel row is
           two stores. Which lanes a run fills depends on kx only and whether its input row is
           inside on ky only: both are worked out once per panel, not per channel. A masked-off
           lane reads nothing, so an address it would name outside the image is never touched. */
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i step = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32((int)q->sw));
        uint32_t lanes[SG_NR * SG_PACK_KW];
        int64_t coloff[SG_NR * SG_PACK_KW], rowoff[SG_NR * 16];
        for (int64_t r = 0; r < runs; r++) {
            int64_t j0 = js[r], j1 = js[r + 1];
            for (int64_t ky = 0; ky < q->kh; ky++) {
                int64_t iy = oys[r] * q->sh - q->pt + ky * q->dh;
                rowoff[r * 16 + ky] = iy < 0 || iy >= q->h ? -1 : iy * q->w;
            }
            for (int64_t kx = 0; kx < q->kw; kx++) {
                int64_t ix0 = oxs[r] * q->sw - q->pl + kx * q->dw;  /* the input column of j0 */
                int64_t lo = j0, hi = j1;
                if (ix0 < 0) lo = j0 + (-ix0 + q->sw - 1) / q->sw;
                if (ix0 + (j1 - 1 - j0) * q->sw >= q->w) {
                    int64_t last = q->w - 1 - ix0;
                    hi = last < 0 ? j0 : j0 + last / q->sw + 1;
                }
                if (lo > j1) lo = j1;
                lanes[r * SG_PACK_KW + kx] = hi <= lo ? 0u : (hi - lo >= 32 ? 0xffffffffu : ((1u << (hi - lo)) - 1u)) << lo;
                coloff[r * SG_PACK_KW + kx] = ix0 - j0 * q->sw;  /* lane j reads element (coloff + j * sw) of the row */
            }
        }
        int64_t kk = 0;
        for (int64_t c = 0; c < q->cg; c++) {
            const float *plane = q->x + (g * q->cg + c) * q->h * q->w;
            for (int64_t ky = 0; ky < q->kh; ky++) {
                for (int64_t kx = 0; kx < q->kw; kx++, kk++) {
                    __m512 v[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
                    for (int64_t r = 0; r < runs; r++) {
                        uint32_t ln = lanes[r * SG_PACK_KW + kx];
                        int64_t ro = rowoff[r * 16 + ky];
                        if (!ln || ro < 0) continue;
                        intptr_t base = (intptr_t)plane + (intptr_t)(ro + coloff[r * SG_PACK_KW + kx]) * (intptr_t)sizeof(float);
                        for (int h = 0; h < 2; h++) {
                            __mmask16 km = (__mmask16)(ln >> (16 * h));
                            if (!km) continue;
                            if (q->sw == 1) {
                                v[h] = _mm512_mask_loadu_ps(v[h], km, (const void *)(base + 64 * h));
                            } else if (q->sw > 2) {
                                v[h] = _mm512_mask_i32gather_ps(v[h], km, step,
                                                                (const void *)(base + (intptr_t)(64 * h) * (intptr_t)q->sw), 4);
                            } else {
                                __m512 lo16 = _mm512_maskz_loadu_ps(sg_even(km), (const void *)(base + 128 * h));
                                __m512 hi16 = _mm512_maskz_loadu_ps(sg_even(km >> 8), (const void *)(base + 128 * h + 64));
                                v[h] = _mm512_mask_mov_ps(v[h], km, _mm512_permutex2var_ps(lo16, even, hi16));
                            }
                        }
                    }
                    float *row = dst + kk * SG_NR;
                    _mm512_storeu_ps(row, v[0]);
                    _mm512_storeu_ps(row + 16, v[1]);
                }
            }
        }
        return;
    }
#endif
    int64_t kk = 0;
    for (int64_t c = 0; c < q->cg; c++) {
        const float *plane = q->x + (g * q->cg + c) * q->h * q->w;
        for (int64_t ky = 0; ky < q->kh; ky++) {
            for (int64_t kx = 0; kx < q->kw; kx++, kk++) {
                float *row = dst + kk * SG_NR;
                for (int64_t r = 0; r < runs; r++) {
                    int64_t j0 = js[r], j1 = js[r + 1];
                    int64_t iy = oys[r] * q->sh - q->pt + ky * q->dh;
                    int64_t ix0 = oxs[r] * q->sw - q->pl + kx * q->dw;  /* the input column of j0 */
                    if (iy < 0 || iy >= q->h) {
                        for (int64_t j = j0; j < j1; j++) row[j] = 0.0f;
                        continue;
                    }
                    /* the columns whose input column lies inside the image: ix0 + (j - j0) * sw in [0, w) */
                    int64_t lo = j0, hi = j1;
                    if (ix0 < 0) lo = j0 + (-ix0 + q->sw - 1) / q->sw;
                    if (ix0 + (j1 - 1 - j0) * q->sw >= q->w) {
                        int64_t last = q->w - 1 - ix0;  /* largest (j - j0) * sw allowed */
                        hi = last < 0 ? j0 : j0 + last / q->sw + 1;
                    }
                    if (lo > j1) lo = j1;
                    if (hi < lo) hi = lo;
                    for (int64_t j = j0; j < lo; j++) row[j] = 0.0f;
                    if (hi > lo) {
                        const float *src = plane + iy * q->w + ix0 + (lo - j0) * q->sw;  /* inside the image */
                        if (q->sw == 1) { for (int64_t j = lo; j < hi; j++) row[j] = src[j - lo]; }
                        else if (q->sw == 2) { for (int64_t j = lo; j < hi; j++) row[j] = src[(j - lo) * 2]; }
                        else { for (int64_t j = lo; j < hi; j++) row[j] = src[(j - lo) * q->sw]; }
                    }
                    for (int64_t j = hi; j < j1; j++) row[j] = 0.0f;
                }
                for (int64_t j = js[runs]; j < SG_NR; j++) row[j] = 0.0f;
            }
        }
    }
}

#if defined(SG_VEC)
/* a run of sg_conv on several threads: task t packs the panels of its chunk of columns for its
   group into its own thread's scratch, then multiplies every row tile of the group over them,
   in that thread's cache (the chunks packed by all threads, then multiplied by all, moved the
   column matrix between the cores twice a chunk: ShuffleNet's grouped 1x1 layers ran slower
   on 2 threads than on 1) */
typedef struct {
    sg_im2col im;
    sg_ctx q;                             /* m: one group's rows */
    const float *x;
    int64_t group_floats;                 /* floats of X a group's channels span */
    int64_t chunk, chunks, panels, nc;
    atomic_int failed;
} sg_cjob;

static void sg_conv_task(void *vc, int64_t t, int slot) {
    sg_cjob *J = (sg_cjob *)vc;
    int64_t g = t / J->chunks, p0 = (t % J->chunks) * J->chunk;
    int64_t np_ = J->panels - p0 < J->chunk ? J->panels - p0 : J->chunk, j0 = p0 * SG_NR;
    float *bp = sg_scratch((size_t)np_ * (size_t)J->q.k * SG_NR);
    if (!bp) { atomic_store(&J->failed, 1); return; }
    sg_im2col im = J->im;
    im.x = J->x + g * J->group_floats;
    im.bp = bp;
    im.p0 = p0;
    im.panels = np_;
    for (int64_t p = 0; p < np_; p++) sg_pack_task(&im, p, slot);
    sg_ctx l = J->q;
    if (g > 0) {
        l.a += l.apack ? g * ((l.m + SG_MR - 1) / SG_MR) * SG_MR * l.k : g * l.m * l.lda;
        l.c += g * l.m * l.ldc;
        if (l.bias_kind == 2) l.bias += g * l.m;
        if (l.z) l.z += g * l.m * l.ldc;
    }
    l.b = bp;
    l.c += j0;
    if (l.z) l.z += j0;
    l.n = J->nc - j0 < np_ * SG_NR ? J->nc - j0 : np_ * SG_NR;
    l.panels = np_; l.per_group = np_; l.groups = 1; l.cgroups = 1;
    l.row_blocks = (l.m + SG_MC - 1) / SG_MC;
    for (int64_t rb = 0; rb < l.row_blocks; rb++) sg_task(&l, rb, slot);
}
#endif

/* one image's convolution: C (M, OH*OW) = W (M, Cg*KH*KW) @ im2col(X (C, H, W)) per group, with
   the epilogue (a 1x1 stride-1 one, or a plain W @ B, is the geometry of ones with B as (K, 1, N));
   the arguments are (X, W, C, bias, bias_kind 0|2, clip 0|1, lo, hi, threads, Z or None, act,
   geometry: int64 [group, kh, kw, sh, sw, dh, dw, pad top, pad left, oh, ow], arows): W is the
   (M, Cg*KH*KW) matrix read in place when arows is -1, else the M = arows rows packed by
   RowPanels, a (group * ceil(M / group / 12) * Cg*KH*KW, 12) array */
static PyObject *sg_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t xd[3], m, kg, ar, ac, mc, nc, kind, clip, width, count, arows;
    if (ge_nargs(n, 13)) return NULL;
    if (ge_int(args, 4, 0, 2, &kind) || ge_int(args, 5, 0, 1, &clip) || ge_int(args, 8, 1, 4096, &width)
        || ge_int(args, 12, -1, (int64_t)1 << 30, &arows)) return NULL;
    if (kind == 1) return ge_fail();
    const float *x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 3, xd);
    const float *a = x ? (const float *)ge_mat(args, 1, NPY_FLOAT, 0, &ar, &ac) : NULL;
    float *c = a ? (float *)ge_mat(args, 2, NPY_FLOAT, 1, &mc, &nc) : NULL;
    const int64_t *geo = c ? (const int64_t *)ge_vec(args, 11, NPY_INT64, 0, &count) : NULL;
    if (!geo) return NULL;
    if (count != 11) return ge_fail();
    int64_t group = geo[0];
    const int64_t lim = (int64_t)1 << 30;
    for (int i = 0; i < 11; i++)
        if (geo[i] < (i == 7 || i == 8 ? 0 : 1) || geo[i] > lim) return ge_fail();
    if (xd[0] % group) return ge_fail();
    kg = ge_prod(xd[0] / group, geo[1], geo[2], 1);  /* (checked: kernel sides up to 2^30 each overflow) */
    if (kg < 0) return ge_fail();
    m = arows < 0 ? ar : arows;
    if (m % group || mc != m || nc != geo[9] * geo[10]) return ge_fail();
    if (arows < 0 ? ac != kg : (ac != SG_MR || ar != group * ((m / group + SG_MR - 1) / SG_MR) * kg)) return ge_fail();
    int64_t mg = m / group, panels = (nc + SG_NR - 1) / SG_NR;
    sg_ctx q = {a, kg, NULL, c, nc, m, nc, kg, NULL, kind, NULL, 0, clip, 0, 0, 0, 0, 0, 0, 0, group, arows >= 0};
    if (sg_epilogue(args, &q, m)) return NULL;
    q.m = mg;
    if (kg == 0 || mg == 0) {
        /* an empty extent first: no products (0 input channels: the epilogue over zero sums,
           B never read; 0 rows: nothing); the chunk sizes below would divide by kg */
        q.b = c;
#if defined(SG_VEC)
        Py_BEGIN_ALLOW_THREADS
        if (mg > 0) sg_exec(&q, width);
        Py_END_ALLOW_THREADS
        Py_RETURN_NONE;
#else
        return sg_run(&q, width);
#endif
    }
#if defined(SG_VEC) && defined(__AVX512F__)
    if (geo[1] == 1 && geo[2] == 1 && geo[3] == 1 && geo[4] == 1 && geo[7] == 0 && geo[8] == 0 && geo[9] == xd[1]
        && geo[10] == xd[2] && nc > 0 && kg <= 128) {
        /* a 1x1 stride-1 convolution with k up to 128: B is the activation itself, channel c's
           plane its row c, read in place by the tiles, a panel's k rows staying in L1 for every
           row tile (packing it cost 12-16% of such a layer: ShuffleNet's grouped 1x1 layers,
           136 channels on 28x28 in 4 groups 95 -> 86 us, 112 on 56x56 271 -> 245 us); with a
           larger k the panel would not stay in L1, and the packed stream is faster */
        q.b = x;
        q.ldb = nc;
        Py_BEGIN_ALLOW_THREADS
        if (m > 0) sg_exec(&q, width);
        Py_END_ALLOW_THREADS
        Py_RETURN_NONE;
    }
#endif
    /* the column matrix in chunks of panels, packed then multiplied while they are in the
       cache: about SG_CONV_CHUNK floats, at least a few panels per thread, and never over
       SG_CONV_SCRATCH floats (a large plane's whole column matrix would be hundreds of MB held
       by the thread) */
    int64_t per_panel = group * kg * SG_NR;
    int64_t chunk = SG_CONV_CHUNK / per_panel, least = width > 1 ? 2 * width : 1;
    if (chunk < least) chunk = least;
    if (chunk > SG_CONV_SCRATCH / per_panel) chunk = SG_CONV_SCRATCH / per_panel;
    if (chunk < 1) chunk = 1;
    if (chunk > panels) chunk = panels;
#if defined(SG_VEC)
    if (width > 1) {
        /* tasks of (group, chunk of panels): about SG_CONV_CHUNK floats packed, 4 a thread */
        sg_cjob J;
        memset(&J, 0, sizeof(J));
        int64_t per = kg * SG_NR, ck = SG_CONV_CHUNK / per;
        if (ck > SG_CONV_SCRATCH / per) ck = SG_CONV_SCRATCH / per;
        if (ck < 1) ck = 1;
        if (ck > panels) ck = panels;
        while (ck > 1 && group * ((panels + ck - 1) / ck) < 4 * width) ck = (ck + 1) / 2;
        sg_im2col im = {x, NULL, xd[0] / group, xd[1], xd[2], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7],
                        geo[8], geo[9], geo[10], nc, kg, 0, 0};
        J.im = im; J.q = q; J.x = x; J.group_floats = (xd[0] / group) * xd[1] * xd[2];
        J.chunk = ck; J.chunks = (panels + ck - 1) / ck; J.panels = panels; J.nc = nc;
        if (!sg_scratch((size_t)ck * (size_t)kg * SG_NR)) return PyErr_NoMemory();
        Py_BEGIN_ALLOW_THREADS
        if (m > 0 && nc > 0) ge_parallel(sg_conv_task, &J, group * J.chunks, width);
        Py_END_ALLOW_THREADS
        if (atomic_load(&J.failed)) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
#endif
    float *bp = sg_scratch((size_t)group * (size_t)(chunk > 0 ? chunk : 1) * (size_t)kg * SG_NR);
    if (!bp) return PyErr_NoMemory();
#if defined(SG_VEC)
    Py_BEGIN_ALLOW_THREADS
    for (int64_t p0 = 0; p0 < panels; p0 += chunk) {
        int64_t np_ = panels - p0 < chunk ? panels - p0 : chunk, j0 = p0 * SG_NR;
        sg_im2col im = {x, bp, xd[0] / group, xd[1], xd[2], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7],
                        geo[8], geo[9], geo[10], nc, kg, np_, p0};
        ge_parallel(sg_pack_task, &im, group * np_, width);
        sg_ctx l = q;
        l.b = bp;
        l.c = c + j0;
        l.n = nc - j0 < np_ * SG_NR ? nc - j0 : np_ * SG_NR;
        if (l.z) l.z += j0;
        sg_exec(&l, width);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return sg_run(&q, width);
#endif
}
