#include "prelude.h"
#include "nchwc.h"

static PyObject *nc_ok(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
#if defined(NC_VEC)
    return PyLong_FromLongLong(1);
#else
    return PyLong_FromLongLong(0);
#endif
}

/* the instruction set the kernels were built for: 2 AVX-512F, 1 AVX2 + FMA, 0 none */
static PyObject *nc_isa(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (ge_nargs(n, 0)) return NULL;
#if defined(NC_VEC)
    return PyLong_FromLongLong(NC_VEC);
#else
    return PyLong_FromLongLong(0);
#endif
}

typedef struct {
    const float *x, *w, *bias, *z;
    float *y;
    int64_t n, cb, h, wd;                 /* input: n images of cb blocks of (h, wd, 16) */
    int64_t mb, oh, ow;                   /* output: mb blocks of (oh, ow, 16) */
    int64_t kh, kw, sh, sw, dh, dw, pt, pl;
    int64_t lo_w, hi_w;                   /* output columns [lo_w, hi_w) whose taps all lie inside the row */
    int64_t has_bias, clip, act, groups;  /* groups: tile groups (of up to 4 output blocks) */
    int64_t cg, gib, gob, tpg;            /* convolution groups of gib input and gob output blocks, tpg tile groups each */
    int64_t chunk, chunks;                /* a task's output columns: chunks of chunk columns a row */
    int64_t wn;                           /* floats of the packed weight */
    int64_t rblk;                         /* ... and rows: blocks of rblk rows */
    float lo, hi;
} nc_ctx;

#if defined(NC_VEC)
/* the epilogue over `count` pixels of block ob stored from y + off on (in the cache, just
   written): + bias, + the addend, the clip, the activation; one copy of the math, not one per
   register of every tile */
static inline void nc_epi(const nc_ctx *q, int64_t ob, int64_t off, int64_t count) {
    nv b = q->has_bias ? nv_load(q->bias + ob * 16) : nv_zero();
    nv lo = nv_set1(q->lo), hi = nv_set1(q->hi);
    float *y = q->y + off;
    const float *z = q->z ? q->z + off : NULL;
    for (int64_t i = 0; i < count; i++) {
        nv v = nv_add(nv_load(y + i * 16), b);
        if (z) v = nv_add(v, nv_load(z + i * 16));
        if (q->clip) v = nv_min(nv_max(v, lo), hi);
        if (q->act) v = nv_act(v, q->act);
        nv_store(y + i * 16, v);
    }
}

NC_AI int64_t nc_off(const nc_ctx *q, int64_t img, int64_t ob, int64_t oh, int64_t ow) {
    return (((img * q->mb + ob) * q->oh + oh) * q->ow + ow) * 16;
}

/* nc_epi over `count` pixels from ow0 of row oh of the fb blocks from ob0: a span of a row whose
   tiles were just stored (in the cache), one call for many tiles */
static __attribute__((noinline)) void nc_epi_span(const nc_ctx *q, int64_t img, int64_t ob0, int64_t fb, int64_t oh,
                                                  int64_t ow0, int64_t count) {
    if (count <= 0 || !(q->has_bias || q->z || q->clip || q->act)) return;
    for (int64_t f = 0; f < fb; f++) nc_epi(q, ob0 + f, nc_off(q, img, ob0 + f, oh, ow0), count);
}

/* the activation over `count` pixels stored from y + off on (in the cache, just written): one
   copy of its math, not one per register of every tile */
static __attribute__((noinline)) void nc_epi_act(const nc_ctx *q, int64_t off, int64_t count) {
    float *y = q->y + off;
    for (int64_t i = 0; i < count; i++) nv_store(y + i * 16, nv_act(nv_load(y + i * 16), q->act));
}

/* the bias, addend and clip of the epilogue on a tile's sums in registers (nc_epi's order):
   acc[p][f] holds pixel p of block ob0 + f */
NC_AI void nc_fin(const nc_ctx *q, nv acc[][4], const int PC, const int FT, int64_t img, int64_t ob0,
                  int64_t oh, int64_t ow0) {
    if (q->has_bias) {
#pragma GCC unroll 4
        for (int f = 0; f < FT; f++) {
            nv b = nv_load(q->bias + (ob0 + f) * 16);
#pragma GCC unroll 24
            for (int p = 0; p < PC; p++) acc[p][f] = nv_add(acc[p][f], b);
        }
    }
    if (q->z) {
#pragma GCC unroll 4
        for (int f = 0; f < FT; f++) {
            const float *z = q->z + nc_off(q, img, ob0 + f, oh, ow0);
#pragma GCC unroll 24
            for (int p = 0; p < PC; p++) acc[p][f] = nv_add(acc[p][f], nv_load(z + p * 16));
        }
    }
    if (q->clip) {
        nv lo = nv_set1(q->lo), hi = nv_set1(q->hi);
#pragma GCC unroll 24
        for (int p = 0; p < PC; p++)
#pragma GCC unroll 4
            for (int f = 0; f < FT; f++) acc[p][f] = nv_min(nv_max(acc[p][f], lo), hi);
    }
}

/* the sums of PC pixels of block ob (nc_fin applied) stored, then the activation over them */
NC_AI void nc_put_act(const nc_ctx *q, const nv *acc, int stride, const int PC, int64_t img, int64_t ob,
                      int64_t oh, int64_t ow0) {
    int64_t off = nc_off(q, img, ob, oh, ow0);
#pragma GCC unroll 24
    for (int p = 0; p < PC; p++) nv_store(q->y + off + p * 16, acc[p * stride]);
    if (q->act) nc_epi_act(q, off, PC);
}

/* the sums of PC pixels of block ob: stored, then the whole epilogue over them */
NC_AI void nc_put(const nc_ctx *q, const nv *acc, int stride, const int PC, int64_t img, int64_t ob,
                  int64_t oh, int64_t ow0) {
    int64_t off = nc_off(q, img, ob, oh, ow0);
#pragma GCC unroll 24
    for (int p = 0; p < PC; p++) nv_store(q->y + off + p * 16, acc[p * stride]);
    if (q->has_bias || q->z || q->clip || q->act) nc_epi(q, ob, off, PC);
}

/* PC output pixels (ow0 ...) of row oh times the FT output blocks fo ... of the tile group of
   FB blocks from ob0, over the input blocks [ib0 + cb0, ib0 + cb1) of their convolution group;
   CHECKED (PC 1): taps outside the row are skipped. The weight of the tile group: (gib, kh, kw,
   16 in, FB * 16 out) from ob0 * gib * kh * kw * 256 on. */
NC_AI void nc_tile(const nc_ctx *q, int64_t img, int64_t ob0, int64_t ib0, int64_t oh, int64_t ow0, const int PC,
                   const int FB, int64_t fo, const int FT, const int CHECKED, const int S1, int64_t cb0, int64_t cb1,
                   const float **pfp, const float *pfe) {
    nv acc[24][4];
    const float *pf = *pfp;
    if (cb0 == 0) {
#pragma GCC unroll 24
        for (int p = 0; p < PC; p++)
#pragma GCC unroll 4
            for (int f = 0; f < FT; f++) acc[p][f] = nv_zero();
    } else {  /* the sums of the input blocks before cb0, stored by the previous batch */
#pragma GCC unroll 4
        for (int f = 0; f < FT; f++) {
            const float *y = q->y + nc_off(q, img, ob0 + fo + f, oh, ow0);
#pragma GCC unroll 24
            for (int p = 0; p < PC; p++) acc[p][f] = nv_load(y + p * 16);
        }
    }
    const int64_t sx = q->sw * 16;
    const float *wg = q->w + ob0 * q->gib * q->kh * q->kw * 256 + fo * 16;
    for (int64_t cb = cb0; cb < cb1; cb++) {
        for (int64_t kh = 0; kh < q->kh; kh++) {
            int64_t ih = oh * q->sh - q->pt + kh * q->dh;
            if (ih < 0 || ih >= q->h) continue;
            const float *xr = q->x + ((img * q->cb + ib0 + cb) * q->h + ih) * q->wd * 16;
            const float *wr = wg + (cb * q->kh + kh) * q->kw * FB * 256;
            for (int64_t kw = 0; kw < q->kw; kw++) {
                int64_t iw0 = ow0 * q->sw - q->pl + kw * q->dw;
                if (CHECKED && (iw0 < 0 || iw0 >= q->wd)) continue;
                const float *xp = xr + iw0 * 16;
                const float *wp = wr + kw * FB * 256;
                /* the pixels' inputs: at stride 1 one base and constant offsets; else a pointer
                   each (offsets p * sx + ci computed per step would be reloaded from the stack) */
                const float *xq[24];
#pragma GCC unroll 24
                for (int p = 0; p < PC; p++) xq[p] = xp + (S1 ? p * 16 : p * sx);
#pragma GCC unroll 4
                for (int ci = 0; ci < 16; ci++) {
                    nv wv[4];
#pragma GCC unroll 4
                    for (int f = 0; f < FT; f++) wv[f] = nv_load(wp + (ci * FB + f) * 16);
                    /* the next weight batch streams from memory meanwhile (a line a step), so no
                       tile waits for a whole batch at its start */
                    if (pf < pfe) {
                        _mm_prefetch((const char *)pf, _MM_HINT_T1);
                        pf += 16;
                    }
#pragma GCC unroll 24
                    for (int p = 0; p < PC; p++) {
                        nb b = nb_set1(S1 ? xp[p * 16 + ci] : xq[p][ci]);
#pragma GCC unroll 4
                        for (int f = 0; f < FT; f++) acc[p][f] = nv_fmab(b, wv[f], acc[p][f]);
                    }
                }
            }
        }
    }
    *pfp = pf;
    /* (the epilogue runs over a span of the row once its tiles are stored: nc_rows_fb) */
#pragma GCC unroll 4
    for (int f = 0; f < FT; f++) {
        float *y = q->y + nc_off(q, img, ob0 + fo + f, oh, ow0);
#pragma GCC unroll 24
        for (int p = 0; p < PC; p++) nv_store(y + p * 16, acc[p][f]);
    }
}

#if NC_VEC == 1
/* AVX2, two blocks (fo, fo + 1) of a group of FB: their four 8-lane halves times PC (<= 3)
   pixels, 12 sums; per input channel PC broadcasts, then each half's weight loaded once into
   one register and used by every pixel (16 registers: onnxruntime's MLAS orders its AVX2 tile
   so); the same sums in the same order as nc_tile's */
NC_AI void nc_tile8(const nc_ctx *q, int64_t img, int64_t ob0, int64_t ib0, int64_t oh, int64_t ow0, const int PC,
                    const int FB, int64_t fo, const int CHECKED, const int S1, int64_t cb0, int64_t cb1) {
    __m256 acc[6][4];  /* (PC <= 3 runs; the dead branches of NC_T instantiate more) */
    if (cb0 == 0) {
#pragma GCC unroll 3
        for (int p = 0; p < PC; p++)
#pragma GCC unroll 4
            for (int f = 0; f < 4; f++) acc[p][f] = _mm256_setzero_ps();
    } else {
#pragma GCC unroll 2
        for (int f = 0; f < 2; f++) {
            const float *y = q->y + nc_off(q, img, ob0 + fo + f, oh, ow0);
#pragma GCC unroll 3
            for (int p = 0; p < PC; p++) {
                acc[p][2 * f] = _mm256_loadu_ps(y + p * 16);
                acc[p][2 * f + 1] = _mm256_loadu_ps(y + p * 16 + 8);
            }
        }
    }
    const int64_t sx = q->sw * 16;
    const float *wg = q->w + ob0 * q->gib * q->kh * q->kw * 256 + fo * 16;
    for (int64_t cb = cb0; cb < cb1; cb++) {
        for (int64_t kh = 0; kh < q->kh; kh++) {
            int64_t ih = oh * q->sh - q->pt + kh * q->dh;
            if (ih < 0 || ih >= q->h) continue;
            const float *xr = q->x + ((img * q->cb + ib0 + cb) * q->h + ih) * q->wd * 16;
            const float *wr = wg + (cb * q->kh + kh) * q->kw * FB * 256;
            for (int64_t kw = 0; kw < q->kw; kw++) {
                int64_t iw0 = ow0 * q->sw - q->pl + kw * q->dw;
                if (CHECKED && (iw0 < 0 || iw0 >= q->wd)) continue;
                const float *xp = xr + iw0 * 16;
                const float *wp = wr + kw * FB * 256;
#pragma GCC unroll 4
                for (int ci = 0; ci < 16; ci++) {
                    if (!CHECKED) _mm_prefetch((const char *)(wp + ci * FB * 16 + 512 * FB), _MM_HINT_T0);
                    __m256 b[6];
#pragma GCC unroll 3
                    for (int p = 0; p < PC; p++) b[p] = _mm256_broadcast_ss(xp + p * (S1 ? 16 : sx) + ci);
#pragma GCC unroll 4
                    for (int f = 0; f < 4; f++) {
                        __m256 w = _mm256_loadu_ps(wp + (ci * FB + f / 2) * 16 + (f % 2) * 8);
#pragma GCC unroll 3
                        for (int p = 0; p < PC; p++) acc[p][f] = _mm256_fmadd_ps(b[p], w, acc[p][f]);
                    }
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int f = 0; f < 2; f++) {
        nv t[6];
#pragma GCC unroll 3
        for (int p = 0; p < PC; p++) t[p] = nv_mk(acc[p][2 * f], acc[p][2 * f + 1]);
        float *y = q->y + nc_off(q, img, ob0 + fo + f, oh, ow0);
#pragma GCC unroll 3
        for (int p = 0; p < PC; p++) nv_store(y + p * 16, t[p]);
    }
}
#endif

/* the tile of PCV pixels at ow for the FT blocks from fo */
#if NC_VEC == 1
#define NC_T(PCV, CHK, S1V)                                                                          \
    do {                                                                                             \
        if (NC_FT(FB) == 2) nc_tile8(q, img, ob0, ib0, oh, ow, PCV, FB, fo, CHK, S1V, cb0, cb1);     \
        else nc_tile(q, img, ob0, ib0, oh, ow, PCV, FB, fo, 1, CHK, S1V, cb0, cb1, &pf, pfe);       \
    } while (0)
#else
#define NC_T(PCV, CHK, S1V) nc_tile(q, img, ob0, ib0, oh, ow, PCV, FB, fo, NC_FT(FB), CHK, S1V, cb0, cb1, &pf, pfe)
#endif
/* ... at each of the group's FB / FT block offsets in turn (one on AVX-512, where FT is FB) */
#define NC_TS(PCV, CHK, S1V) for (int64_t fo = 0; fo < FB; fo += NC_FT(FB)) NC_T(PCV, CHK, S1V)

#define NC_REST(FB, PCMAX, S1)                                                                        \
    switch (r) {                                                                                      \
    case 1: NC_TS(1, 0, S1); break;                                                                   \
    case 2: NC_TS(2, 0, S1); break;                                                                   \
    case 3: NC_TS(3, 0, S1); break;                                                                   \
    case 4: if (PCMAX > 4) NC_TS(4, 0, S1); break;                                                    \
    case 5: if (PCMAX > 5) NC_TS(5, 0, S1); break;                                                    \
    case 6: if (PCMAX > 6) NC_TS(6, 0, S1); break;                                                    \
    case 7: if (PCMAX > 7) NC_TS(7, 0, S1); break;                                                    \
    default: break;                                                                                   \
    }

/* rows [r0, r1) of group g at FB blocks, columns [c0, c1): the input blocks in batches whose
   weights (cbb blocks x taps x 16 x FB * 16; an AVX2 tile holds one block, the group's take
   turns at each tile while its inputs are in L1) stay in L1 while the tiles sweep every row of
   the task (the weights come from memory once a task, the sums go through the output between
   batches); in a row the border pixels one at a time (checked), the inside in tiles of PCMAX */
NC_AI void nc_rows_fb(const nc_ctx *q, int64_t img, int64_t ob0, int64_t ib0, int64_t r0, int64_t r1, int64_t c0,
                      int64_t c1, const int FB, const int PCMAX, const int S1, const int W2) {
    (void)W2;
    int64_t lo = q->lo_w > c0 ? q->lo_w : c0, hi = q->hi_w < c1 ? q->hi_w : c1;
    if (lo > c1) lo = c1;
    if (hi < lo) hi = lo;
    int64_t cbb = NC_WBATCH / (q->kh * q->kw * 256 * FB);
    if (cbb < 1) cbb = 1;
    const int64_t span = q->kh * q->kw * FB * 256;  /* the weight of an input block of the tile group */
    const float *wbase = q->w + ob0 * q->gib * q->kh * q->kw * 256, *wend = q->w + q->wn;
    for (int64_t cb0 = 0; cb0 < q->gib; cb0 += cbb) {
        int64_t cb1 = cb0 + cbb < q->gib ? cb0 + cbb : q->gib;
        /* the weight after this batch: the group's next batch, or the next group's first */
        const float *pf = wbase + cb1 * span, *pfe = pf + cbb * span < wend ? pf + cbb * span : wend;
        const int last = cb1 == q->gib;
        for (int64_t oh = r0; oh < r1; oh++) {
            int64_t ow = c0, done = c0;  /* [c0, done): the epilogue ran there */
            for (; ow < lo; ow++) NC_TS(1, 1, 0);
            /* (tiles of 3: a row that leaves 1 ends in two tiles of 2 instead, not in 3 and a
               latency-bound single pixel: a 28-wide row cost 8% more) */
            int64_t stop = PCMAX == 3 && (hi - ow) % 3 == 1 && hi - ow >= 4 ? hi - 4 : hi;
            for (; ow + PCMAX <= stop; ow += PCMAX) {
                NC_TS(PCMAX, 0, S1);
                /* (a long row, a 1x1 convolution's plane: the epilogue every 48 pixels or so,
                   while they are in L1) */
                if (last && ow + PCMAX - done >= 48) {
                    nc_epi_span(q, img, ob0, FB, oh, done, ow + PCMAX - done);
                    done = ow + PCMAX;
                }
            }
            if (stop != hi) {
                NC_TS(2, 0, S1);
                ow += 2;
                NC_TS(2, 0, S1);
                ow += 2;
            }
            int64_t r = hi - ow;
            /* (a wide tile's rest: 8 pixels at a time, then fewer) */
            for (; PCMAX > 8 && r >= 8; r -= 8, ow += 8) NC_TS(PCMAX > 8 ? 8 : 1, 0, S1);
            if (r > 0) { NC_REST(FB, PCMAX, S1) }
            for (ow = hi; ow < c1; ow++) NC_TS(1, 1, 0);
            if (last) nc_epi_span(q, img, ob0, FB, oh, done, c1 - done);
        }
    }
}

/* tile group g (up to 4 output blocks of one convolution group) of image img over output rows
   [r0, r1) and columns [c0, c1) */
static void nc_conv_part(const nc_ctx *q, int64_t img, int64_t g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t cgi = g / q->tpg, f0 = (g % q->tpg) * 4, ob0 = cgi * q->gob + f0, ib0 = cgi * q->gib;
    int64_t fb = q->gob - f0 < 4 ? q->gob - f0 : 4;
#if NC_VEC == 1
    /* AVX2: the two-block tile (3 pixels x 32 channels) where it measured faster, on 1x1
       convolutions and narrow planes (7x7 512 channels 64 -> 77 GFLOP/s, 1x1 +5%), the
       one-block tile (6 pixels x 16) on wide ones (28x28: 89 against 85) */
    if ((q->kh * q->kw == 1 || q->ow <= 14) && fb % 2 == 0) {
        if (fb == 4) {
            if (q->sw == 1) nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 4, 3, 1, 1);
            else nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 4, 3, 0, 1);
        } else {
            if (q->sw == 1) nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 2, 3, 1, 1);
            else nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 2, 3, 0, 1);
        }
        return;
    }
#endif
    /* (stride 1, the common case: one input pointer and constant offsets for the pixels) */
    /* (the fewer output blocks, the more pixels a tile: 24 sums in registers whatever FB) */
    if (q->sw == 1) {
        switch (fb) {
        case 4: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 4, NC_PC4, 1, 0); break;
        case 3: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 3, NC_PC3, 1, 0); break;
        case 2: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 2, NC_PC2, 1, 0); break;
        default: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 1, NC_PC1, 1, 0); break;
        }
    } else {
        switch (fb) {
        case 4: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 4, NC_PCS < NC_PC4 ? NC_PCS : NC_PC4, 0, 0); break;
        case 3: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 3, NC_PCS, 0, 0); break;
        case 2: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 2, NC_PCS < NC_PC2 ? NC_PCS : NC_PC2, 0, 0); break;
        default: nc_rows_fb(q, img, ob0, ib0, r0, r1, c0, c1, 1, NC_PCS, 0, 0); break;
        }
    }
}

/* task t: (image, block of rblk rows, chunk of columns, tile group): the tile groups of a part
   of the plane one after the other (its input stays in the cache while their weights stream) */
static void nc_conv_task(void *ctx, int64_t t, int slot) {
    const nc_ctx *q = (const nc_ctx *)ctx;
    (void)slot;
    int64_t rb = (q->oh + q->rblk - 1) / q->rblk, per_g = rb * q->chunks, per_img = q->groups * per_g;
    int64_t img = t / per_img, r = t % per_img, g = r % q->groups, b = (r / q->groups) / q->chunks, ch = (r / q->groups) % q->chunks;
    int64_t r0 = b * q->rblk, r1 = r0 + q->rblk < q->oh ? r0 + q->rblk : q->oh;
    int64_t c0 = ch * q->chunk, c1 = c0 + q->chunk < q->ow ? c0 + q->chunk : q->ow;
    nc_conv_part(q, img, g, r0, r1, c0, c1);
}

/* an NCHW input (a stem's 3 channels; cb is its channel count): PC pixels times the FT output
   blocks fo ... of a group of FB, a broadcast input value per pixel, channel and tap; the
   weight of group g: (c, kh, kw, FB * 16) from g * 4 * c * kh * kw * 16 on */
NC_AI void nc_plain_tile(const nc_ctx *q, int64_t img, int64_t g, int64_t oh, int64_t ow0, const int PC, const int FB,
                         int64_t fo, const int FT, const int CHECKED) {
    nv acc[8][4];
#pragma GCC unroll 8
    for (int p = 0; p < PC; p++)
#pragma GCC unroll 4
        for (int f = 0; f < FT; f++) acc[p][f] = nv_zero();
    const float *wg = q->w + g * 4 * q->cb * q->kh * q->kw * 16 + fo * 16;
    for (int64_t c = 0; c < q->cb; c++) {
        for (int64_t kh = 0; kh < q->kh; kh++) {
            int64_t ih = oh * q->sh - q->pt + kh * q->dh;
            if (ih < 0 || ih >= q->h) continue;
            const float *xr = q->x + ((img * q->cb + c) * q->h + ih) * q->wd;
            const float *wr = wg + (c * q->kh + kh) * q->kw * FB * 16;
            for (int64_t kw = 0; kw < q->kw; kw++) {
                int64_t iw0 = ow0 * q->sw - q->pl + kw * q->dw;
                if (CHECKED && (iw0 < 0 || iw0 >= q->wd)) continue;
                const float *xp = xr + iw0;
                nv wv[4];
#pragma GCC unroll 4
                for (int f = 0; f < FT; f++) wv[f] = nv_load(wr + (kw * FB + f) * 16);
#pragma GCC unroll 8
                for (int p = 0; p < PC; p++) {
                    nb b = nb_set1(xp[p * q->sw]);
#pragma GCC unroll 4
                    for (int f = 0; f < FT; f++) acc[p][f] = nv_fmab(b, wv[f], acc[p][f]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int f = 0; f < FT; f++) nc_put(q, &acc[0][f], 4, PC, img, g * 4 + fo + f, oh, ow0);
}

#define NC_PLAIN(PCV, CHK) \
    for (int64_t fo = 0; fo < FB; fo += NC_FTP(FB)) nc_plain_tile(q, img, g, oh, ow, PCV, FB, fo, NC_FTP(FB), CHK)

NC_AI void nc_plain_rows(const nc_ctx *q, int64_t img, int64_t g, int64_t r0, int64_t r1, const int FB) {
    for (int64_t oh = r0; oh < r1; oh++) {
        int64_t ow = 0;
        for (; ow < q->lo_w; ow++) NC_PLAIN(1, 1);
        for (; ow + 6 <= q->hi_w; ow += 6) NC_PLAIN(6, 0);
        for (; ow + 2 <= q->hi_w; ow += 2) NC_PLAIN(2, 0);
        for (; ow < q->hi_w; ow++) NC_PLAIN(1, 0);
        for (ow = q->hi_w > q->lo_w ? q->hi_w : q->lo_w; ow < q->ow; ow++) NC_PLAIN(1, 1);
    }
}

static void nc_plain_task(void *ctx, int64_t t, int slot) {
    const nc_ctx *q = (const nc_ctx *)ctx;
    (void)slot;
    int64_t rb = (q->oh + q->rblk - 1) / q->rblk, per_img = q->groups * rb;
    int64_t img = t / per_img, r = t % per_img, g = r / rb, b = r % rb;
    int64_t r0 = b * q->rblk, r1 = r0 + q->rblk < q->oh ? r0 + q->rblk : q->oh;
    int64_t fb = q->mb - g * 4 < 4 ? q->mb - g * 4 : 4;
    switch (fb) {
    case 4: nc_plain_rows(q, img, g, r0, r1, 4); break;
    case 3: nc_plain_rows(q, img, g, r0, r1, 3); break;
    case 2: nc_plain_rows(q, img, g, r0, r1, 2); break;
    default: nc_plain_rows(q, img, g, r0, r1, 1); break;
    }
}

/* a thread's scratch, kept between calls (a fresh block per call would be new pages to fault
   in, every layer of every run): the convolution's padded copy (the calling thread's) and a
   depthwise task's padded rows (each thread's) */
static __thread float *nc_buf = NULL, *nc_dw_buf = NULL;
static __thread size_t nc_cap = 0, nc_dw_cap = 0;
static float *nc_grow(float **buf, size_t *cap, size_t count) {
    if (count == 0) count = 1;  /* (an empty extent's scratch: a buffer all the same, not NULL) */
    if (count > *cap) {
        free(*buf);
        *buf = (float *)aligned_alloc(64, ((count * sizeof(float) + 63) / 64) * 64);
        *cap = *buf ? count : 0;
    }
    return *buf;
}
static float *nc_scratch(size_t count) { return nc_grow(&nc_buf, &nc_cap, count); }

/* the end of a depthwise tile: its PC sums (the bias in them) + the addend, clipped, stored at
   `off`, then the activation over what was stored */
NC_AI void nc_dw_store(const nc_ctx *q, nv *acc, int64_t off, const int PC) {
    if (q->z) {
#pragma GCC unroll 12
        for (int p = 0; p < PC; p++) acc[p] = nv_add(acc[p], nv_load(q->z + off + p * 16));
    }
    if (q->clip) {
        nv lo = nv_set1(q->lo), hi = nv_set1(q->hi);
#pragma GCC unroll 12
        for (int p = 0; p < PC; p++) acc[p] = nv_min(nv_max(acc[p], lo), hi);
    }
#pragma GCC unroll 12
    for (int p = 0; p < PC; p++) nv_store(q->y + off + p * 16, acc[p]);
    if (q->act) nc_epi_act(q, off, PC);
}

/* depthwise: PC pixels of one block, xb its input plane (h, wd, 16) (the taps from row -pt,
   column -pl on), w its weight (kh, kw, 16); CHECKED: a tile that reaches past a border, each
   pixel's taps outside the row skipped */
NC_AI void nc_dw_tile(const nc_ctx *q, const float *xb, int64_t h, int64_t wd, int64_t pt, int64_t pl,
                      const float *w, int64_t img, int64_t cb, int64_t oh, int64_t ow0, const int PC,
                      const int CHECKED) {
    nv acc[12];
    /* the sums start from the bias; the addend and the clip are applied in registers before the
       store (a pass over the output for them cost as much as a third of a 3x3 layer) */
    nv b = q->has_bias ? nv_load(q->bias + cb * 16) : nv_zero();
#pragma GCC unroll 12
    for (int p = 0; p < PC; p++) acc[p] = b;
    const int64_t sx = q->sw * 16;
    for (int64_t kh = 0; kh < q->kh; kh++) {
        int64_t ih = oh * q->sh - pt + kh * q->dh;
        if (ih < 0 || ih >= h) continue;
        const float *xr = xb + ih * wd * 16;
        const float *wr = w + kh * q->kw * 16;
        for (int64_t kw = 0; kw < q->kw; kw++) {
            int64_t iw0 = ow0 * q->sw - pl + kw * q->dw;
            nv wv = nv_load(wr + kw * 16);
            const float *xp = xr + iw0 * 16;
#pragma GCC unroll 12
            for (int p = 0; p < PC; p++) {
                if (CHECKED && (iw0 + p * q->sw < 0 || iw0 + p * q->sw >= wd)) continue;
                acc[p] = nv_fma(nv_load(xp + p * sx), wv, acc[p]);
            }
        }
    }
    nc_dw_store(q, acc, nc_off(q, img, cb, oh, ow0), PC);
}

/* nc_dw_tile at stride 1, undilated, unchecked, for a kernel KW wide: each input row's PC + KW - 1
   vectors the tile reads loaded once and kept in registers for the KW taps (nc_dw_tile loads one
   per multiply-add: a 7x7 layer ran at half the FMA rate, load-bound) */
NC_AI void nc_dw_tile_s1(const nc_ctx *q, const float *xb, int64_t h, int64_t wd, int64_t pt, int64_t pl,
                         const float *w, int64_t img, int64_t cb, int64_t oh, int64_t ow0, const int PC,
                         const int KW) {
    nv acc[12];
    nv b = q->has_bias ? nv_load(q->bias + cb * 16) : nv_zero();
#pragma GCC unroll 12
    for (int p = 0; p < PC; p++) acc[p] = b;
    const float *xc = xb + (ow0 - pl) * 16;
    for (int64_t kh = 0; kh < q->kh; kh++) {
        int64_t ih = oh * q->sh - pt + kh * q->dh;
        if (ih < 0 || ih >= h) continue;
        const float *xr = xc + ih * wd * 16;
        const float *wr = w + kh * KW * 16;
        nv xin[18];
#pragma GCC unroll 18
        for (int j = 0; j < PC + KW - 1; j++) xin[j] = nv_load(xr + j * 16);
#pragma GCC unroll 7
        for (int kw = 0; kw < KW; kw++) {
            nv wv = nv_load(wr + kw * 16);
#pragma GCC unroll 12
            for (int p = 0; p < PC; p++) acc[p] = nv_fma(xin[p + kw], wv, acc[p]);
        }
    }
    nc_dw_store(q, acc, nc_off(q, img, cb, oh, ow0), PC);
}

#define NC_DWS_CASE(PCV, KWV) case PCV: nc_dw_tile_s1(q, xb, h, wd, pt, pl, w, img, cb, oh, ow, PCV, KWV); break;
#define NC_DWS_ROW(KWV)                                                                              \
    switch (n) {                                                                                     \
    NC_DWS_CASE(1, KWV) NC_DWS_CASE(2, KWV) NC_DWS_CASE(3, KWV) NC_DWS_CASE(4, KWV)                  \
    NC_DWS_CASE(5, KWV) NC_DWS_CASE(6, KWV) NC_DWS_ROW_MORE(KWV)                                      \
    default: break;                                                                                  \
    }
#if NC_DWMAX > 6
#define NC_DWS_ROW_MORE(KWV) NC_DWS_CASE(7, KWV) NC_DWS_CASE(8, KWV) NC_DWS_CASE(9, KWV) NC_DWS_CASE(10, KWV) \
    NC_DWS_CASE(11, KWV) NC_DWS_CASE(12, KWV)
#else
#define NC_DWS_ROW_MORE(KWV)
#endif

#define NC_DW_CASE(PCV)                                                                              \
    case PCV:                                                                                        \
        if (chk) nc_dw_tile(q, xb, h, wd, pt, pl, w, img, cb, oh, ow, PCV, 1);                       \
        else nc_dw_tile(q, xb, h, wd, pt, pl, w, img, cb, oh, ow, PCV, 0);                           \
        break;

/* one output row: the pixels whose window crosses the left or right border one at a time,
   checked, the columns [lo, hi) between in tiles of equal width (at most NC_DWMAX: on AVX-512 a
   14-pixel row is two of 7, not 12 and two latency-bound single pixels), unchecked */
static void nc_dw_row(const nc_ctx *q, const float *xb, int64_t h, int64_t wd, int64_t pt, int64_t pl,
                      int64_t lo, int64_t hi, int64_t img, int64_t cb, int64_t oh) {
    const float *w = q->w + cb * q->kh * q->kw * 16;
    int chk = 1;
    for (int64_t ow = 0; ow < lo; ow++) nc_dw_tile(q, xb, h, wd, pt, pl, w, img, cb, oh, ow, 1, 1);
    for (int64_t ow = hi > lo ? hi : lo; ow < q->ow; ow++) nc_dw_tile(q, xb, h, wd, pt, pl, w, img, cb, oh, ow, 1, 1);
    chk = 0;
    int64_t inner = hi - lo, tiles = (inner + NC_DWMAX - 1) / NC_DWMAX, pc = tiles ? (inner + tiles - 1) / tiles : 1;
    /* (stride 1, undilated, 3, 5 or 7 wide: the input rows in registers) */
    int s1 = q->sw == 1 && q->dw == 1 && (q->kw == 3 || q->kw == 5 || q->kw == 7);
    for (int64_t ow = lo; ow < hi; ow += pc) {
        int64_t n = hi - ow < pc ? hi - ow : pc;
        if (s1) {
            if (q->kw == 3) { NC_DWS_ROW(3) }
            else if (q->kw == 5) { NC_DWS_ROW(5) }
            else { NC_DWS_ROW(7) }
            continue;
        }
        switch (n) {
        NC_DW_CASE(1) NC_DW_CASE(2) NC_DW_CASE(3) NC_DW_CASE(4) NC_DW_CASE(5) NC_DW_CASE(6)
#if NC_DWMAX > 6
        NC_DW_CASE(7) NC_DW_CASE(8) NC_DW_CASE(9) NC_DW_CASE(10) NC_DW_CASE(11) NC_DW_CASE(12)
#endif
        default: break;
        }
    }
}

/* task t: (image, block, rblk rows). The input rows the task reads are copied first, with zero
   rows and columns where the window crosses a border, into the thread's scratch (they fit in
   its cache: at most NC_DW_COPY floats), so every tile runs unchecked (a tile with a tap test
   per pixel runs several times slower); larger ones check their border tiles */
#define NC_DW_COPY (64 * 1024)
static void nc_dw_task(void *ctx, int64_t t, int slot) {
    const nc_ctx *q = (const nc_ctx *)ctx;
    (void)slot;
    int64_t rb = (q->oh + q->rblk - 1) / q->rblk, per_img = q->cb * rb;
    int64_t img = t / per_img, r = t % per_img, cb = r / rb, r0 = (r % rb) * q->rblk;
    int64_t r1 = r0 + q->rblk < q->oh ? r0 + q->rblk : q->oh;
    const float *xb = q->x + (img * q->cb + cb) * q->h * q->wd * 16;
    int64_t ih0 = r0 * q->sh - q->pt, ih1 = (r1 - 1) * q->sh - q->pt + (q->kh - 1) * q->dh + 1;
    int64_t wp = (q->ow - 1) * q->sw + (q->kw - 1) * q->dw + 1;
    /* (rows that cross the top or bottom border skip their taps outside cheaply: a copy only
       where the pixels crossing the left or right border are many, a tenth of the row or more) */
    int border = (q->ow - (q->hi_w - q->lo_w)) * 10 >= q->ow;
    float *buf = NULL;
    if (border && (ih1 - ih0) * wp <= NC_DW_COPY / 16) buf = nc_grow(&nc_dw_buf, &nc_dw_cap, (size_t)((ih1 - ih0) * wp * 16));
    if (buf) {
        for (int64_t ih = ih0; ih < ih1; ih++) {
            float *d = buf + (ih - ih0) * wp * 16;
            if (ih < 0 || ih >= q->h) { memset(d, 0, (size_t)wp * 16 * sizeof(float)); continue; }
            /* columns [-pl, wp - pl) of the row: zeros outside [0, wd) */
            int64_t a = q->pl < wp ? q->pl : wp, e = q->pl + q->wd < wp ? q->pl + q->wd : wp;
            memset(d, 0, (size_t)a * 16 * sizeof(float));
            if (e > a) memcpy(d + a * 16, xb + (ih * q->wd + (a - q->pl)) * 16, (size_t)(e - a) * 16 * sizeof(float));
            if (wp > e) memset(d + e * 16, 0, (size_t)(wp - e) * 16 * sizeof(float));
        }
        for (int64_t oh = r0; oh < r1; oh++) nc_dw_row(q, buf, ih1 - ih0, wp, r0 * q->sh, 0, 0, q->ow, img, cb, oh);
    } else {
        for (int64_t oh = r0; oh < r1; oh++) nc_dw_row(q, xb, q->h, q->wd, q->pt, q->pl, q->lo_w, q->hi_w, img, cb, oh);
    }
}

/* pooling: kind 0 max (taps outside skipped), 1 average over the window with the padding,
   2 average over the taps inside */
static void nc_pool_task(void *ctx, int64_t t, int slot) {
    const nc_ctx *q = (const nc_ctx *)ctx;
    (void)slot;
    int64_t per_img = q->cb * q->oh;
    int64_t img = t / per_img, r = t % per_img, cb = r / q->oh, oh = r % q->oh;
    for (int64_t ow = 0; ow < q->ow; ow++) {
        nv acc = q->act == 0 ? nv_set1(-INFINITY) : nv_zero();
        int64_t inside = 0;
        for (int64_t kh = 0; kh < q->kh; kh++) {
            int64_t ih = oh * q->sh - q->pt + kh * q->dh;
            if (ih < 0 || ih >= q->h) continue;
            const float *xr = q->x + ((img * q->cb + cb) * q->h + ih) * q->wd * 16;
            for (int64_t kw = 0; kw < q->kw; kw++) {
                int64_t iw = ow * q->sw - q->pl + kw * q->dw;
                if (iw < 0 || iw >= q->wd) continue;
                nv v = nv_load(xr + iw * 16);
                acc = q->act == 0 ? nv_max(v, acc) : nv_add(acc, v);
                inside++;
            }
        }
        /* (max: a NaN input lane stays NaN: vmaxps returns its second operand when either is NaN,
           and the input is the first) */
        if (q->act == 1) acc = nv_mul(acc, nv_set1(1.0f / (float)(q->kh * q->kw)));
        else if (q->act == 2) acc = nv_mul(acc, nv_set1(inside ? 1.0f / (float)inside : 0.0f));
        nv_store(q->y + (((img * q->cb + cb) * q->oh + oh) * q->ow + ow) * 16, acc);
    }
}

/* the mean of each (image, block) plane: y (n, mb * 16) */
static void nc_gap_task(void *ctx, int64_t t, int slot) {
    const nc_ctx *q = (const nc_ctx *)ctx;
    (void)slot;
    const float *xr = q->x + t * q->h * q->wd * 16;
    nv a0 = nv_zero(), a1 = nv_zero();
    int64_t hw = q->h * q->wd, i = 0;
    for (; i + 2 <= hw; i += 2) {
        a0 = nv_add(a0, nv_load(xr + i * 16));
        a1 = nv_add(a1, nv_load(xr + i * 16 + 16));
    }
    if (i < hw) a0 = nv_add(a0, nv_load(xr + i * 16));
    nv_store(q->y + t * 16, nv_mul(nv_add(a0, a1), nv_set1(1.0f / (float)hw)));
}
#endif

/* the columns [lo, hi) of an output row whose taps all lie inside an input row of wd */
static void nc_inside(nc_ctx *q) {
    int64_t lo = (q->pl + q->sw - 1) / q->sw;                /* ow * sw - pl >= 0 */
    int64_t last = q->wd - 1 + q->pl - (q->kw - 1) * q->dw;  /* ow * sw <= last */
    int64_t hi = last < 0 ? 0 : last / q->sw + 1;
    if (hi > q->ow) hi = q->ow;
    if (lo > q->ow) lo = q->ow;
    if (hi < lo) hi = lo;
    q->lo_w = lo;
    q->hi_w = hi;
}

/* the geometry int64 [kh, kw, sh, sw, dh, dw, pt, pl] of argument i, checked */
static int nc_geometry(PyObject *const *args, int i, nc_ctx *q) {
    int64_t count;
    const int64_t *geo = (const int64_t *)ge_vec(args, i, NPY_INT64, 0, &count);
    if (!geo) return -1;
    if (count != 8) { ge_fail(); return -1; }
    for (int k = 0; k < 8; k++)
        if (geo[k] < (k >= 6 ? 0 : 1) || geo[k] > ((int64_t)1 << 20)) { ge_fail(); return -1; }
    q->kh = geo[0]; q->kw = geo[1]; q->sh = geo[2]; q->sw = geo[3]; q->dh = geo[4]; q->dw = geo[5];
    q->pt = geo[6]; q->pl = geo[7];
    return 0;
}

/* x (n, cb, h, w, 16) and y (n, mb, oh, ow, 16) at args 0 and 2; mb free (-1) or given */
static int nc_arrays(PyObject *const *args, nc_ctx *q, int64_t want_mb) {
    int64_t xd[5], yd[5];
    q->x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 5, xd);
    q->y = q->x ? (float *)ge_nd(args, 2, NPY_FLOAT, 1, 5, yd) : NULL;
    if (!q->y) return -1;
    if (xd[4] != 16 || yd[4] != 16 || yd[0] != xd[0] || (want_mb >= 0 && yd[1] != want_mb)) { ge_fail(); return -1; }
    q->n = xd[0]; q->cb = xd[1]; q->h = xd[2]; q->wd = xd[3];
    q->mb = yd[1]; q->oh = yd[2]; q->ow = yd[3];
    /* (no read leaves x whatever the geometry: a tap's row is tested against h, its column
       against wd, except in the columns nc_inside proves inside) */
    if ((const void *)q->x == (const void *)q->y) { ge_fail(); return -1; }
    nc_inside(q);
    return 0;
}

/* the epilogue arguments at 3..: bias (mb * 16), has_bias, clip, lo, hi, threads, Z or None, act */
static int nc_epilogue(PyObject *const *args, nc_ctx *q, int64_t *width) {
    if (ge_int(args, 4, 0, 1, &q->has_bias) || ge_int(args, 5, 0, 1, &q->clip) || ge_int(args, 8, 1, 4096, width)
        || ge_int(args, 10, 0, 5, &q->act)) return -1;
    q->bias = (const float *)ge_arr(args, 3, NPY_FLOAT, 0, q->has_bias ? q->mb * 16 : 0);
    if (!q->bias) return -1;
    double lo = PyFloat_AsDouble(args[6]), hi = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred()) return -1;
    q->lo = (float)lo;
    q->hi = (float)hi;
    int64_t size = q->n * q->mb * q->oh * q->ow * 16;
    q->z = args[9] == Py_None ? NULL : (const float *)ge_arr(args, 9, NPY_FLOAT, 0, size);
    if (args[9] != Py_None && !q->z) return -1;
    if (q->z && (const void *)q->z == (const void *)q->y) { ge_fail(); return -1; }
    return 0;
}

typedef struct { const float *x; float *xp; int64_t h, wd, wp, pl; } nc_padding;


/* one input row (image, block, row) into the copy padded left and right with zeros */
static void nc_pad_task(void *ctx, int64_t t, int slot) {
    const nc_padding *r = (const nc_padding *)ctx;
    (void)slot;
    const float *src = r->x + t * r->wd * 16;
    float *dst = r->xp + t * r->wp * 16;
    memset(dst, 0, (size_t)r->pl * 16 * sizeof(float));
    memcpy(dst + r->pl * 16, src, (size_t)r->wd * 16 * sizeof(float));
    memset(dst + (r->pl + r->wd) * 16, 0, (size_t)(r->wp - r->pl - r->wd) * 16 * sizeof(float));
}

/* refuse a convolution with no input channels: its tiles store after the last input block, so
   with none the output would stay unwritten (the caller's NumPy form runs it: the bias alone) */
static PyObject *nc_no_inputs(void) {
    PyErr_SetString(PyExc_ValueError, "native kernel: a convolution of no input channels");
    return NULL;
}

/* y = act(clip(conv(x, w) + bias + z)): (x, w packed (1-D), y, bias, has_bias, clip, lo, hi,
   threads, z or None, act, geometry[, convolution groups]); depthwise when dw is 1 (w (cb, kh,
   kw, 16), mb == cb); else the groups (whole blocks each) last */
static PyObject *nc_conv_any(PyObject *const *args, Py_ssize_t n, int dw) {
    nc_ctx q;
    memset(&q, 0, sizeof(q));
    int64_t width, wn;
    if (ge_nargs(n, dw ? 12 : 13) || nc_geometry(args, 11, &q) || nc_arrays(args, &q, -1)) return NULL;
    if (nc_epilogue(args, &q, &width)) return NULL;
    q.cg = 1;
    if (!dw && ge_int(args, 12, 1, 1 << 20, &q.cg)) return NULL;
    if (q.cb % q.cg || q.mb % q.cg) return ge_fail();
    q.w = (const float *)ge_vec(args, 1, NPY_FLOAT, 0, &wn);
    if (!q.w) return NULL;
    q.wn = wn;
    q.gib = q.cb / q.cg;
    q.gob = q.mb / q.cg;
    q.tpg = (q.gob + 3) / 4;
    q.groups = q.cg * q.tpg;
    q.chunk = q.ow > 0 ? q.ow : 1;
    q.chunks = 1;
    int64_t need = dw ? ge_prod(q.cb, q.kh, q.kw, 16) : ge_prod(q.mb * 16, q.gib * 16, q.kh, q.kw);
    if ((dw && q.mb != q.cb) || need < 0 || wn != need) return ge_fail();
    /* an empty extent first: the task sizes below divide by the plane's width */
    if (q.n <= 0 || q.mb <= 0 || q.oh <= 0 || q.ow <= 0) Py_RETURN_NONE;
    if (q.cb <= 0) return nc_no_inputs();
    if (!dw && q.kh == 1 && q.kw == 1 && q.sh == 1 && q.sw == 1 && q.pt == 0 && q.pl == 0 && q.oh == q.h && q.ow == q.wd) {
        /* a 1x1 convolution: the plane is one row of h * w pixels (full tiles on small planes),
           in chunks of whole tiles (tasks for the threads when there are few channel groups) */
        q.wd = q.ow = q.h * q.wd;
        q.h = q.oh = 1;
        nc_inside(&q);
        q.chunks = (q.ow + 767) / 768;
        q.chunk = ((q.ow + q.chunks - 1) / q.chunks + 23) / 24 * 24;
        q.chunks = (q.ow + q.chunk - 1) / q.chunk;
    }
    /* rows per task: all of them (each weight batch read once), halved until the tasks keep
       the threads busy (4 a thread) */
    q.rblk = q.oh > 0 ? q.oh : 1;
    /* (a depthwise task: whole planes of a block, split only until there are 8 tasks a thread:
       a task claimed is an atomic on a line the threads share) */
    if (dw) while (q.rblk > 1 && q.n * q.cb * ((q.oh + q.rblk - 1) / q.rblk) < 8 * width) q.rblk = (q.rblk + 1) / 2;
    if (!dw) {
        while (q.rblk > 1 && q.n * q.groups * q.chunks * ((q.oh + q.rblk - 1) / q.rblk) < 4 * width) q.rblk = (q.rblk + 1) / 2;
        /* ... and chunks of columns halved too when a plane is one row (a 1x1 one) */
        while (q.chunk > 24 && q.n * q.groups * q.chunks * ((q.oh + q.rblk - 1) / q.rblk) < 4 * width) {
            q.chunk = ((q.chunk / 2) + 23) / 24 * 24;
            q.chunks = (q.ow + q.chunk - 1) / q.chunk;
        }
    }
#if defined(NC_VEC)
    /* columns whose window crosses the left or right border: the rows are copied with zeros
       on both sides first, so every tile is a whole one (pixels one at a time, there, cost
       a third of a 7x7 plane's row) */
    float *padded = NULL;
    /* (not for a depthwise one: its border pixels cost little one at a time, and the copy of a
       large plane as much as the convolution) */
    if (!dw && (q.lo_w > 0 || q.hi_w < q.ow) && q.cb > 0 && q.h > 0) {  /* (no input rows: nothing to pad) */
        int64_t wp = (q.ow - 1) * q.sw + (q.kw - 1) * q.dw + 1;
        if (wp < q.wd + q.pl) wp = q.wd + q.pl;
        int64_t rows = q.n * q.cb * q.h, size = ge_prod(rows, wp, 16, 1);
        if (size < 0 || wp > ((int64_t)1 << 24)) return ge_fail();
        padded = nc_scratch((size_t)size);
        if (!padded) return PyErr_NoMemory();
        nc_padding r = {q.x, padded, q.h, q.wd, wp, q.pl};
        Py_BEGIN_ALLOW_THREADS
        ge_parallel(nc_pad_task, &r, rows, width);
        Py_END_ALLOW_THREADS
        q.x = padded;
        q.wd = wp;
        q.pl = 0;
        nc_inside(&q);
    }
    Py_BEGIN_ALLOW_THREADS
    if (dw) ge_parallel(nc_dw_task, &q, q.n * q.cb * ((q.oh + q.rblk - 1) / q.rblk), width);
    else ge_parallel(nc_conv_task, &q, q.n * q.groups * ((q.oh + q.rblk - 1) / q.rblk) * q.chunks, width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}

/* the convolution of an NCHW x (n, c, h, w) into a blocked y: the arguments of nc_conv, the
   weight packed (c, kh, kw, 16 out) per group of 4 output blocks */
static PyObject *nc_conv_plain(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    nc_ctx q;
    memset(&q, 0, sizeof(q));
    int64_t width, wn, xd[4], yd[5];
    if (ge_nargs(n, 12) || nc_geometry(args, 11, &q)) return NULL;
    q.x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 4, xd);
    q.y = q.x ? (float *)ge_nd(args, 2, NPY_FLOAT, 1, 5, yd) : NULL;
    if (!q.y) return NULL;
    if (yd[4] != 16 || yd[0] != xd[0] || (const void *)q.x == (const void *)q.y) return ge_fail();
    q.n = xd[0]; q.cb = xd[1]; q.h = xd[2]; q.wd = xd[3];
    q.mb = yd[1]; q.oh = yd[2]; q.ow = yd[3];
    nc_inside(&q);
    if (nc_epilogue(args, &q, &width)) return NULL;
    q.w = (const float *)ge_vec(args, 1, NPY_FLOAT, 0, &wn);
    if (!q.w) return NULL;
    q.wn = wn;
    int64_t need = ge_prod(q.mb * 16, q.cb, q.kh, q.kw);
    if (need < 0 || wn != need) return ge_fail();
    if (q.n <= 0 || q.mb <= 0 || q.oh <= 0 || q.ow <= 0) Py_RETURN_NONE;
    if (q.cb <= 0) return nc_no_inputs();
    q.groups = (q.mb + 3) / 4;
    q.rblk = q.oh;
    while (q.rblk > 1 && q.n * q.groups * ((q.oh + q.rblk - 1) / q.rblk) < 8 * width) q.rblk = (q.rblk + 1) / 2;
#if defined(NC_VEC)
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(nc_plain_task, &q, q.n * q.groups * ((q.oh + q.rblk - 1) / q.rblk), width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}

/* ------------------------------------------------------------------------------------------------
   Winograd F(m x m, 3 x 3) on blocked values (m = 4 or 2; Lavin & Gray), for 3x3 stride-1
   undilated ungrouped convolutions. Each m x m block of outputs (a tile) comes from the
   (m + 2) x (m + 2) inputs around it: V = B^T d B per input block (P = (m + 2)^2 points, additions
   and small multiples), Y = U . V summed over the input channels at each point (P products of
   (tiles x C) and (C x M): 1x1 convolutions over a plane of tiles, nc_conv_part's tiles), then
   o = A^T Y A and the epilogue. U = G g G^T was made when the weight was packed (one 1x1 packing
   per point). F(4x4) multiplies 4x less than the direct sum, F(2x2) 2.25x less. */
#if defined(NC_VEC)
typedef struct {
    const float *x, *z, *bias;
    float *y;
    const float *u;
    int64_t n, cb, h, wd, mb, oh, ow, pt, pl, m, p, th, tw, t, ulen;
    int64_t has_bias, clip, act;
    int64_t tc, chunks;               /* tiles a task, and tile chunks an image */
    int64_t sets, gps;                /* sets of tile groups a chunk, tile groups a set */
    float lo, hi;
    atomic_int failed;                /* a thread found no memory for its scratch */
    nc_ctx gemm;                      /* the products' 1x1 convolution (x, y, w set per task) */
} nc_wino_ctx;

/* 1-D transforms of R = M + 2 values: the input's B^T, the output's A^T */
NC_AI void nc_wb(const int M, const nv *d, nv *r) {
    if (M == 4) {
        nv four = nv_set1(4.0f), two = nv_set1(2.0f), m4 = nv_set1(-4.0f), m5 = nv_set1(-5.0f);
        nv t0 = nv_fma(m4, d[2], d[4]), t1 = nv_fma(m4, d[1], d[3]);
        nv t2 = nv_sub(d[4], d[2]), t3 = nv_sub(d[3], d[1]);
        r[0] = nv_fma(four, d[0], nv_fma(m5, d[2], d[4]));
        r[1] = nv_add(t0, t1);
        r[2] = nv_sub(t0, t1);
        r[3] = nv_fma(two, t3, t2);
        r[4] = nv_fma(nv_set1(-2.0f), t3, t2);
        r[5] = nv_fma(four, d[1], nv_fma(m5, d[3], d[5]));
    } else {
        r[0] = nv_sub(d[0], d[2]);
        r[1] = nv_add(d[1], d[2]);
        r[2] = nv_sub(d[2], d[1]);
        r[3] = nv_sub(d[1], d[3]);
    }
}
NC_AI void nc_wa(const int M, const nv *y, nv *o) {
    if (M == 4) {
        nv a = nv_add(y[1], y[2]), b = nv_sub(y[1], y[2]), c = nv_add(y[3], y[4]), d = nv_sub(y[3], y[4]);
        o[0] = nv_add(nv_add(y[0], a), c);
        o[1] = nv_fma(nv_set1(2.0f), d, b);
        o[2] = nv_fma(nv_set1(4.0f), c, a);
        o[3] = nv_add(nv_fma(nv_set1(8.0f), d, b), y[5]);
    } else {
        o[0] = nv_add(nv_add(y[0], y[1]), y[2]);
        o[1] = nv_sub(nv_sub(y[1], y[2]), y[3]);
    }
}

/* V = B^T d B of tiles [t0, t1) of input block cb of image img into v: point pt's tiles from
   v + pt * vps on, a tile 16 floats */
NC_AI void nc_wino_in(const nc_wino_ctx *q, int64_t img, int64_t cb, int64_t t0, int64_t t1, float *v,
                      int64_t vps, const int M) {
    const int R = M + 2;
    const float *xb = q->x + (img * q->cb + cb) * q->h * q->wd * 16;
    for (int64_t t = t0; t < t1; t++) {
        int64_t ih0 = t / q->tw * M - q->pt, iw0 = t % q->tw * M - q->pl;
        nv tmp[6][6];
        int inside = ih0 >= 0 && ih0 + R <= q->h && iw0 >= 0 && iw0 + R <= q->wd;
#pragma GCC unroll 6
        for (int i = 0; i < R; i++) {
            nv d[6];
            int64_t ih = ih0 + i;
            if (inside) {
#pragma GCC unroll 6
                for (int j = 0; j < R; j++) d[j] = nv_load(xb + (ih * q->wd + iw0 + j) * 16);
            } else {
#pragma GCC unroll 6
                for (int j = 0; j < R; j++) {
                    int64_t iw = iw0 + j;
                    d[j] = ih >= 0 && ih < q->h && iw >= 0 && iw < q->wd ? nv_load(xb + (ih * q->wd + iw) * 16) : nv_zero();
                }
            }
            nc_wb(M, d, tmp[i]);  /* tmp[i][b]: row i, column point b */
        }
        float *vt = v + (t - t0) * 16;
#pragma GCC unroll 6
        for (int b = 0; b < R; b++) {
            nv col[6], r[6];
#pragma GCC unroll 6
            for (int i = 0; i < R; i++) col[i] = tmp[i][b];
            nc_wb(M, col, r);
#pragma GCC unroll 6
            for (int a = 0; a < R; a++) nv_store(vt + (a * R + b) * vps, r[a]);
        }
    }
}

/* o = A^T Y A of tiles [t0, t1) of output block ob of image img (point pt's from yb + pt * yps
   on), the epilogue, into the output */
NC_AI void nc_wino_out(const nc_wino_ctx *q, int64_t img, int64_t ob, int64_t t0, int64_t t1, const float *yb,
                       int64_t yps, const int M) {
    const int R = M + 2;
    float *ob_out = q->y + (img * q->mb + ob) * q->oh * q->ow * 16;
    const float *zb = q->z ? q->z + (img * q->mb + ob) * q->oh * q->ow * 16 : NULL;
    nv bias = q->has_bias ? nv_load(q->bias + ob * 16) : nv_zero();
    nv lo = nv_set1(q->lo), hi = nv_set1(q->hi);
    for (int64_t t = t0; t < t1; t++) {
        int64_t th = t / q->tw, tw = t % q->tw;
        const float *yt = yb + (t - t0) * 16;
        nv tmp[4][6];
#pragma GCC unroll 6
        for (int b = 0; b < R; b++) {
            nv col[6], o[4];
#pragma GCC unroll 6
            for (int a = 0; a < R; a++) col[a] = nv_load(yt + (a * R + b) * yps);
            nc_wa(M, col, o);
#pragma GCC unroll 4
            for (int i = 0; i < M; i++) tmp[i][b] = o[i];
        }
#pragma GCC unroll 4
        for (int i = 0; i < M; i++) {
            int64_t oh = th * M + i;
            if (oh >= q->oh) break;
            nv o[4];
            nc_wa(M, tmp[i], o);
#pragma GCC unroll 4
            for (int j = 0; j < M; j++) {
                int64_t ow = tw * M + j;
                if (ow >= q->ow) break;
                int64_t off = (oh * q->ow + ow) * 16;
                nv r = nv_add(o[j], bias);
                if (zb) r = nv_add(r, nv_load(zb + off));
                if (q->clip) r = nv_min(nv_max(r, lo), hi);
                nv_store(ob_out + off, r);
            }
        }
        if (q->act) {  /* (the activation over the tile's rows just written: one copy of its math) */
            nc_ctx e;
            memset(&e, 0, sizeof(e));
            e.y = q->y; e.mb = q->mb; e.oh = q->oh; e.ow = q->ow; e.act = q->act;
            int64_t cols = q->ow - tw * M < M ? q->ow - tw * M : M;
            for (int i = 0; i < M && th * M + i < q->oh; i++) nc_epi_act(&e, nc_off(&e, img, ob, th * M + i, tw * M), cols);
        }
    }
}

#define NC_WINO_V (1024 * 1024)
#define NC_WINO_VC (256 * 1024)

/* a thread's transformed tiles and products, kept between calls (the same thread's cache holds
   them from one task to the next: no line of them moves between cores) */
static __thread float *nc_wv_buf = NULL, *nc_wy_buf = NULL;
static __thread size_t nc_wv_cap = 0, nc_wy_cap = 0;

/* task (image, chunk of tc tiles, set of tile groups): the chunk's input transform (every input
   block), the products at each point for the set's output blocks (1x1 convolutions over the
   chunk's tiles, nc_conv_part), their output transform and epilogue: all on this thread, in its
   cache (a phase per call with the threads sharing the transformed tiles ran 2-4x slower at 2
   threads where the cores share no cache) */
static void nc_wino_task(void *ctx, int64_t task, int slot) {
    const nc_wino_ctx *q = (const nc_wino_ctx *)ctx;
    (void)slot;
    int64_t per_img = q->chunks * q->sets, img = task / per_img, r = task % per_img;
    int64_t ch = r / q->sets, set = r % q->sets;
    int64_t t0 = ch * q->tc, t1 = t0 + q->tc < q->t ? t0 + q->tc : q->t, nt = t1 - t0;
    int64_t g0 = set * q->gps, g1 = g0 + q->gps < q->gemm.groups ? g0 + q->gps : q->gemm.groups;
    float *v = nc_grow(&nc_wv_buf, &nc_wv_cap, (size_t)(q->p * q->cb * q->tc * 16));
    float *yy = v ? nc_grow(&nc_wy_buf, &nc_wy_cap, (size_t)(q->p * q->mb * q->tc * 16)) : NULL;
    if (!yy) {  /* no memory for this thread's scratch: the call raises MemoryError */
        atomic_store(&((nc_wino_ctx *)q)->failed, 1);
        return;
    }
    /* V: (point, input block, tile) */
    for (int64_t cb = 0; cb < q->cb; cb++) {
        if (q->m == 4) nc_wino_in(q, img, cb, t0, t1, v + cb * nt * 16, q->cb * nt * 16, 4);
        else nc_wino_in(q, img, cb, t0, t1, v + cb * nt * 16, q->cb * nt * 16, 2);
    }
    /* the products: Y (point, output block, tile) for the set's tile groups */
    nc_ctx g = q->gemm;
    g.wd = g.ow = nt;
    nc_inside(&g);
    for (int64_t pt = 0; pt < q->p; pt++) {
        g.x = v + pt * q->cb * nt * 16;
        g.y = yy + pt * q->mb * nt * 16;
        g.w = q->u + pt * q->ulen;
        g.wn = (q->p - pt) * q->ulen;
        for (int64_t gi = g0; gi < g1; gi++) nc_conv_part(&g, 0, gi, 0, 1, 0, nt);
    }
    /* the set's output blocks */
    int64_t tpg = q->gemm.tpg, gob = q->gemm.gob;
    for (int64_t gi = g0; gi < g1; gi++) {
        int64_t end = (gi / tpg + 1) * gob, ob0 = gi / tpg * gob + gi % tpg * 4, ob1 = ob0 + 4 < end ? ob0 + 4 : end;
        for (int64_t ob = ob0; ob < ob1; ob++) {
            if (q->m == 4) nc_wino_out(q, img, ob, t0, t1, yy + ob * nt * 16, q->mb * nt * 16, 4);
            else nc_wino_out(q, img, ob, t0, t1, yy + ob * nt * 16, q->mb * nt * 16, 2);
        }
    }
}
#endif

/* y = act(clip(conv3x3(x, w) + bias + z)) by Winograd: (x, u (1-D, winograd_weights), y, bias,
   has_bias, clip, lo, hi, threads, z or None, act, geometry, m, groups (whole blocks each)) */
static PyObject *nc_wino(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    nc_ctx q;
    memset(&q, 0, sizeof(q));
    int64_t width, un, m, cg;
    if (ge_nargs(n, 14) || nc_geometry(args, 11, &q) || nc_arrays(args, &q, -1)) return NULL;
    if (nc_epilogue(args, &q, &width) || ge_int(args, 12, 2, 4, &m) || ge_int(args, 13, 1, 1 << 20, &cg)) return NULL;
    if ((m != 2 && m != 4) || q.kh != 3 || q.kw != 3 || q.sh != 1 || q.sw != 1 || q.dh != 1 || q.dw != 1) return ge_fail();
    if (q.cb % cg || q.mb % cg) return ge_fail();
    const float *u = (const float *)ge_vec(args, 1, NPY_FLOAT, 0, &un);
    if (!u) return NULL;
    int64_t r = m + 2, p = r * r, ulen = ge_prod(q.mb * 16, q.cb / cg * 16, 1, 1);
    if (ulen < 0 || ge_prod(ulen, p, 1, 1) != un) return ge_fail();
    if (q.n <= 0 || q.mb <= 0 || q.oh <= 0 || q.ow <= 0) Py_RETURN_NONE;
    if (q.cb <= 0) return nc_no_inputs();
#if defined(NC_VEC)
    nc_wino_ctx w;
    memset(&w, 0, sizeof(w));
    w.x = q.x; w.y = q.y; w.z = q.z; w.bias = q.bias; w.u = u;
    w.n = q.n; w.cb = q.cb; w.h = q.h; w.wd = q.wd; w.mb = q.mb; w.oh = q.oh; w.ow = q.ow;
    w.pt = q.pt; w.pl = q.pl; w.m = m; w.p = p; w.ulen = ulen;
    w.th = (q.oh + m - 1) / m; w.tw = (q.ow + m - 1) / m; w.t = w.th * w.tw;
    w.has_bias = q.has_bias; w.clip = q.clip; w.act = q.act; w.lo = q.lo; w.hi = q.hi;
    /* the products: a 1x1 convolution of cb input blocks into mb output blocks over a plane of
       1 x tc pixels (the chunk's tiles), no epilogue */
    nc_ctx *g = &w.gemm;
    g->n = 1; g->cb = q.cb; g->h = 1; g->mb = q.mb; g->oh = 1;
    g->kh = g->kw = g->sh = g->sw = g->dh = g->dw = 1;
    g->cg = cg; g->gib = q.cb / cg; g->gob = q.mb / cg; g->tpg = (g->gob + 3) / 4; g->groups = cg * g->tpg;
    g->chunk = 1; g->chunks = 1; g->rblk = 1;
    /* tiles a task: all of them when their transformed inputs (P x cb x t x 64 bytes) fit in
       NC_WINO_V of L2 (then each point's weight is read once a call: a 7x7 plane's weight, 1.8x
       the direct one, comes from memory), else chunks whose inputs take NC_WINO_VC (the weight,
       small then, read once a chunk) */
    int64_t per = p * q.cb * 64;
    w.tc = w.t;
    if (per * w.t > NC_WINO_V) {
        w.tc = NC_WINO_VC / per;
        if (w.tc < 6) w.tc = 6;
        if (w.tc > w.t) w.tc = w.t;
    }
    w.chunks = (w.t + w.tc - 1) / w.tc;
    /* ... and for the threads 4 tasks each: the tile groups in sets first (each set transforms
       the chunk's inputs again, a few percent of its products, but reads only its weight), then
       smaller chunks */
    w.sets = 1;
    while (width > 1 && q.n * w.chunks * w.sets < 4 * width) {
        if (w.sets < g->groups) {
            w.sets++;
        } else if (w.tc >= 12) {
            w.tc = (w.tc + 1) / 2;
            w.chunks = (w.t + w.tc - 1) / w.tc;
        } else {
            break;
        }
    }
    w.gps = (g->groups + w.sets - 1) / w.sets;
    w.sets = (g->groups + w.gps - 1) / w.gps;
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(nc_wino_task, &w, q.n * w.chunks * w.sets, width);
    Py_END_ALLOW_THREADS
    if (atomic_load(&w.failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}

/* the Winograd weight of F(m x m, 3x3) as nc_wino reads it: (w (M * C * 9 float32; C the channels
   of a group), M, C, cb (input blocks of a group), m, out (P * mb * 16 * cb * 16 float32, zeros
   where no channel is), kron(G, G) (P * 9 float64), groups); U at each point summed in double,
   each point packed as pack_weights packs a 1x1 weight (grouped: each group's in turn, whole
   blocks each) */
static PyObject *nc_wino_pack(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t mo, c, cb, m, wn, on, kn, cg;
    if (ge_nargs(n, 8) || ge_int(args, 1, 1, 1 << 20, &mo) || ge_int(args, 2, 1, 1 << 20, &c)
        || ge_int(args, 3, 1, 1 << 20, &cb) || ge_int(args, 4, 2, 4, &m) || ge_int(args, 7, 1, 1 << 20, &cg)) return NULL;
    const float *w = (const float *)ge_vec(args, 0, NPY_FLOAT, 0, &wn);
    float *out = w ? (float *)ge_vec(args, 5, NPY_FLOAT, 1, &on) : NULL;
    const double *k = out ? (const double *)ge_vec(args, 6, NPY_DOUBLE, 0, &kn) : NULL;
    if (!k) return NULL;
    int64_t p = (m + 2) * (m + 2), mb = (mo + 15) / 16, plen = ge_prod(mb * 16, cb * 16, 1, 1);
    if ((m != 2 && m != 4) || cb * 16 < c || plen < 0 || wn != ge_prod(mo, c, 9, 1) || kn != p * 9
        || on != ge_prod(plen, p, 1, 1) || (cg > 1 && (mo % (cg * 16) || c != cb * 16))) return ge_fail();
    int64_t gob = mb / cg;  /* output blocks a group */
    Py_BEGIN_ALLOW_THREADS
    memset(out, 0, (size_t)on * sizeof(float));
    for (int64_t o = 0; o < mo; o++) {
        /* its convolution group, and the tile group of up to 4 output blocks inside that */
        int64_t ob = o / 16, gi = ob / gob, g0 = gi * gob + (ob - gi * gob) / 4 * 4;
        int64_t fb = (gi + 1) * gob - g0 < 4 ? (gi + 1) * gob - g0 : 4;
        float *og = out + g0 * 16 * cb * 16 + (ob - g0) * 16 + o % 16;  /* the group's (cb, in, fb, out) */
        for (int64_t ci = 0; ci < c; ci++) {
            const float *g = w + (o * c + ci) * 9;
            float *dst = og + ci * fb * 16;
            for (int64_t pt = 0; pt < p; pt++) {
                double u = 0;
                for (int j = 0; j < 9; j++) u += k[pt * 9 + j] * (double)g[j];
                dst[pt * plen] = (float)u;
            }
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* a packed weight with each input channel scaled (an SE block's scale folded into the next
   convolution): (w (1-D), scale (cb * 16 float32), out (1-D, as w), cb (input blocks), taps
   (kh * kw), mb (output blocks), depthwise 0|1); pack_weights' layout (groups of up to 4 output
   blocks, each (cb, taps, 16 in, fb * 16 out)) or pack_depthwise's ((cb, taps, 16)) */
static PyObject *nc_scale_w(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t wn, sn, on, cb, taps, mb, dw;
    if (ge_nargs(n, 7) || ge_int(args, 3, 1, 1 << 20, &cb) || ge_int(args, 4, 1, 1 << 20, &taps)
        || ge_int(args, 5, 1, 1 << 20, &mb) || ge_int(args, 6, 0, 1, &dw)) return NULL;
    const float *w = (const float *)ge_vec(args, 0, NPY_FLOAT, 0, &wn);
    const float *sc = w ? (const float *)ge_vec(args, 1, NPY_FLOAT, 0, &sn) : NULL;
    float *out = sc ? (float *)ge_vec(args, 2, NPY_FLOAT, 1, &on) : NULL;
    if (!out) return NULL;
    int64_t need = dw ? ge_prod(cb, taps, 16, 1) : ge_prod(mb * 16, cb * 16, taps, 1);
    if (need < 0 || wn != need || on != need || sn != cb * 16 || (dw && mb != cb)) return ge_fail();
    if ((const void *)out == (const void *)w) return ge_fail();
    Py_BEGIN_ALLOW_THREADS
    if (dw) {
        for (int64_t i = 0; i < cb * taps; i++)
            for (int l = 0; l < 16; l++) out[i * 16 + l] = w[i * 16 + l] * sc[(i / taps) * 16 + l];
    } else {
        int64_t off = 0;
        for (int64_t g0 = 0; g0 < mb; g0 += 4) {
            int64_t row = (mb - g0 < 4 ? mb - g0 : 4) * 16;  /* the floats of one input channel and tap */
            for (int64_t b = 0; b < cb; b++)
                for (int64_t t = 0; t < taps; t++)
                    for (int64_t ci = 0; ci < 16; ci++, off += row) {
                        float f = sc[b * 16 + ci];
                        for (int64_t o = 0; o < row; o++) out[off + o] = w[off + o] * f;
                    }
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *nc_conv(PyObject *self, PyObject *const *args, Py_ssize_t n) { return nc_conv_any(args, n, 0); }
static PyObject *nc_dwconv(PyObject *self, PyObject *const *args, Py_ssize_t n) { return nc_conv_any(args, n, 1); }

/* (x, kind 0|1|2, y, threads, geometry) */
static PyObject *nc_pool(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    nc_ctx q;
    memset(&q, 0, sizeof(q));
    int64_t width;
    if (ge_nargs(n, 5) || ge_int(args, 1, 0, 2, &q.act) || ge_int(args, 3, 1, 4096, &width)
        || nc_geometry(args, 4, &q) || nc_arrays(args, &q, -1)) return NULL;
    if (q.mb != q.cb) return ge_fail();
    if (q.n <= 0 || q.cb <= 0 || q.oh <= 0 || q.ow <= 0) Py_RETURN_NONE;
#if defined(NC_VEC)
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(nc_pool_task, &q, q.n * q.cb * q.oh, width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}

/* (x (n, cb, h, w, 16), y (n, cb * 16), threads) */
static PyObject *nc_gap(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    nc_ctx q;
    memset(&q, 0, sizeof(q));
    int64_t xd[5], yr, yc, width;
    if (ge_nargs(n, 3) || ge_int(args, 2, 1, 4096, &width)) return NULL;
    q.x = (const float *)ge_nd(args, 0, NPY_FLOAT, 0, 5, xd);
    q.y = q.x ? (float *)ge_mat(args, 1, NPY_FLOAT, 1, &yr, &yc) : NULL;
    if (!q.y) return NULL;
    if (xd[4] != 16 || yr != xd[0] || yc != xd[1] * 16 || xd[2] * xd[3] <= 0) return ge_fail();
    q.h = xd[2]; q.wd = xd[3];
#if defined(NC_VEC)
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(nc_gap_task, &q, xd[0] * xd[1], width);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return ge_fail();
#endif
}
