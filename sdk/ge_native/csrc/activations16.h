
#include <immintrin.h>
#if defined(__AVX512F__)
#define SG_C(v) _mm512_set1_ps(v)
/* the shared core of sg_exp16 and sg_expneg16 on a clamped argument xc: exp's polynomial on the
   reduced argument, and in *n the power of two (the prelude's ge_exp_core on 16 lanes) */
static inline __attribute__((always_inline)) __m512 sg_expcore16(__m512 xc, __m512i *n_out) {
    __m512 t = _mm512_fmadd_ps(xc, SG_C(1.44269504088896341f), SG_C(12582912.0f));
    __m512 fx = _mm512_sub_ps(t, SG_C(12582912.0f));
    __m512 r = _mm512_fnmadd_ps(fx, SG_C(-2.12194440e-4f), _mm512_fnmadd_ps(fx, SG_C(0.693359375f), xc));
    __m512 p = _mm512_fmadd_ps(SG_C(1.9875691500e-4f), r, SG_C(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, SG_C(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, SG_C(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, SG_C(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, SG_C(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), SG_C(1.0f));
    __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000));
    *n_out = n;
    return y;
}

/* exp of 16 lanes in registers: the prelude's exp32 (Cephes: the same reduction, polynomial,
   clamps and two-factor scaling; a NaN lane passes through), with fused multiply-adds */
static inline __attribute__((always_inline)) __m512 sg_exp16(__m512 x) {
    __m512 xc = _mm512_max_ps(_mm512_min_ps(x, SG_C(88.8f)), SG_C(-104.0f));
    __m512i n;
    __m512 y = sg_expcore16(xc, &n);
    __m512i n1 = _mm512_srai_epi32(n, 1), n2 = _mm512_sub_epi32(n, n1);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    y = _mm512_mul_ps(_mm512_mul_ps(y, s1), s2);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x, y);
}

/* erf of 16 lanes: the prelude's erf32 (its GE_ERF_RATIO on [-3.92, 3.92], held in [-1, 1]) */
static inline __attribute__((always_inline)) __m512 sg_erf16(__m512 x) {
    __m512 c = _mm512_max_ps(_mm512_min_ps(x, SG_C(3.92f)), SG_C(-3.92f));
    __m512 t = _mm512_mul_ps(c, c);
    __m512 r = GE_ERF_RATIO(_mm512_fmadd_ps, _mm512_mul_ps, _mm512_div_ps, SG_C, c, t);
    r = _mm512_max_ps(_mm512_min_ps(r, SG_C(1.0f)), SG_C(-1.0f));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x, r);
}

/* the activations of ACTIVATIONS on 16 lanes in registers (act32's math, lane for lane) */
/* exp(-v) for a sigmoid, its argument held in [-80, 88.8]: the result is a normal float, so one
   scaling by 2^n does (sg_exp16's two guard its denormal results), and a NaN lane stays NaN (min
   and max return their second operand then); 1 / (1 + exp(-v)) of v below -88.8 is then
   1 / (1 + 3.6e38) (as sg_exp16 had it), above 80 it is 1 - 1.8e-35, that is 1: 22% fewer
   cycles a vector than through sg_exp16 (SiLU at a convolution's store 5.5 -> 4.3 ns a vector) */
static inline __attribute__((always_inline)) __m512 sg_expneg16(__m512 v) {
    __m512 xc = _mm512_max_ps(SG_C(-80.0f), _mm512_min_ps(SG_C(88.8f), _mm512_sub_ps(_mm512_setzero_ps(), v)));
    __m512i n;
    __m512 y = sg_expcore16(xc, &n);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23)));
}

static inline __attribute__((always_inline)) __m512 sg_act16(__m512 v, int64_t act) {
    if (act == 1) return _mm512_div_ps(SG_C(1.0f), _mm512_add_ps(SG_C(1.0f), sg_expneg16(v)));
    if (act == 2) return _mm512_div_ps(v, _mm512_add_ps(SG_C(1.0f), sg_expneg16(v)));
    if (act == 3)
        return _mm512_mul_ps(_mm512_mul_ps(SG_C(0.5f), v), _mm512_add_ps(SG_C(1.0f), sg_erf16(_mm512_mul_ps(v, SG_C(0.70710678118654752f)))));
    if (act == 4) {  /* v * sigmoid(2u), act32's form */
        __m512 u2 = _mm512_mul_ps(v, _mm512_fmadd_ps(SG_C(0.0713548162726f), _mm512_mul_ps(v, v), SG_C(1.5957691216057308f)));
        return _mm512_div_ps(v, _mm512_add_ps(SG_C(1.0f), sg_expneg16(u2)));
    }
    if (act == 5) {  /* (a NaN lane: max/min return their second operand, so it stays NaN in g and v * g) */
        __m512 g = _mm512_fmadd_ps(v, SG_C(1.0f / 6.0f), SG_C(0.5f));
        g = _mm512_min_ps(SG_C(1.0f), _mm512_max_ps(SG_C(0.0f), g));
        return _mm512_mul_ps(v, g);
    }
    return v;
}

/* exp of 16 lanes for x <= 0 (a softmax's differences from the row's max): exactly 0 below -87.3
   (a masked score weighs nothing, and no denormal slows the products after), NaN passed through */
static inline __attribute__((always_inline)) __m512 sg_softexp16(__m512 x) {
    __m512i n;
    __m512 y = sg_expcore16(_mm512_max_ps(x, SG_C(-87.3f)), &n);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23)));
    y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, SG_C(-87.3f), _CMP_GE_OQ), y);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), x, y);
}

/* softmax of one float32 row of d values, r * alpha + mk (mk: a mask row, or NULL), into o (o may
   be r): the max, the exps stored and summed in one pass, the scaling. Without a mask and with
   alpha > 0 the max is r's and each exp's argument one multiply-add, r * alpha - alpha * max;
   with a mask a value is the multiply-add r * alpha + mk. A row of 16 or more ends on a whole
   vector, its last 16 values, read before any store and stored last with plain stores: a masked
   store at a row's end stalled the next row's first load, which shares its cache line (in place,
   rows of 197: 68 -> 44 us for 591 rows). A NaN enters the sum: the row is NaN. */
static inline __attribute__((always_inline)) __m512 sg_sm_value16(const float *r, const float *mk, int64_t k,
                                                                  __m512 al, int raw) {
    __m512 v = _mm512_loadu_ps(r + k);
    if (mk) return _mm512_fmadd_ps(v, al, _mm512_loadu_ps(mk + k));
    return raw ? v : _mm512_mul_ps(v, al);
}
static inline void sg_softmax_row16(const float *r, const float *mk, float *o, int64_t d, float alpha) {
    int64_t k, full = d / 16 * 16, rem = d % 16;
    int raw = !mk && alpha > 0.0f;  /* the max of r, scaled after */
    __m512 al = _mm512_set1_ps(alpha);
    if (d < 16) {
        __mmask16 m = (__mmask16)((1u << d) - 1u);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, r), al);
        if (mk) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, mk));
        __m512 mm = _mm512_set1_ps(_mm512_mask_reduce_max_ps(m, v));
        __m512 e = _mm512_maskz_mov_ps(m, sg_softexp16(_mm512_sub_ps(v, mm)));
        _mm512_mask_storeu_ps(o, m, _mm512_mul_ps(e, _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(e))));
        return;
    }
    __m512 vl = sg_sm_value16(r, mk, d - 16, al, raw);
    __m512 mv = vl;
    for (k = 0; k < full; k += 16) mv = _mm512_max_ps(mv, sg_sm_value16(r, mk, k, al, raw));
    float mx = _mm512_reduce_max_ps(mv);
    /* exp's argument: v - max, or r * alpha - alpha * max for raw values */
    __m512 mm = _mm512_set1_ps(raw ? mx * alpha : mx), sv = _mm512_setzero_ps();
#define SG_SM_ARG(v) (raw ? _mm512_fmsub_ps(v, al, mm) : _mm512_sub_ps(v, mm))
    for (k = 0; k < full; k += 16) {
        __m512 e = sg_softexp16(SG_SM_ARG(sg_sm_value16(r, mk, k, al, raw)));
        _mm512_storeu_ps(o + k, e);
        sv = _mm512_add_ps(sv, e);
    }
    /* the last vector's lanes past `full` (its others are the loop's last values, the same bits) */
    __m512 el = sg_softexp16(SG_SM_ARG(vl));
#undef SG_SM_ARG
    sv = _mm512_mask_add_ps(sv, (__mmask16)~((1u << (16 - rem)) - 1u), sv, el);
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
    for (k = 0; k < full; k += 16) _mm512_storeu_ps(o + k, _mm512_mul_ps(_mm512_loadu_ps(o + k), inv));
    if (rem) _mm512_storeu_ps(o + d - 16, _mm512_mul_ps(el, inv));
}

#elif defined(__AVX2__) && defined(__FMA__)
/* the same math on 8 lanes in AVX2 registers (sg_exp8, sg_erf8, sg_act8): lane for
   lane the AVX-512 forms', for the kernels that run on AVX2 (ge_native.nchwc) */
#define SG_C8(v) _mm256_set1_ps(v)
#define SG_SIGN8 _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u))
/* the shared core of sg_exp8 and sg_expneg8 on a clamped argument xc: exp's polynomial on the
   reduced argument, and in *n the power of two (the prelude's ge_exp_core on 8 lanes) */
static inline __attribute__((always_inline)) __m256 sg_expcore8(__m256 xc, __m256i *n_out) {
    __m256 t = _mm256_fmadd_ps(xc, SG_C8(1.44269504088896341f), SG_C8(12582912.0f));
    __m256 fx = _mm256_sub_ps(t, SG_C8(12582912.0f));
    __m256 r = _mm256_fnmadd_ps(fx, SG_C8(-2.12194440e-4f), _mm256_fnmadd_ps(fx, SG_C8(0.693359375f), xc));
    __m256 p = _mm256_fmadd_ps(SG_C8(1.9875691500e-4f), r, SG_C8(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, SG_C8(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, SG_C8(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, SG_C8(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, SG_C8(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), SG_C8(1.0f));
    __m256i n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000));
    *n_out = n;
    return y;
}

static inline __attribute__((always_inline)) __m256 sg_exp8(__m256 x) {
    __m256 xc = _mm256_max_ps(_mm256_min_ps(x, SG_C8(88.8f)), SG_C8(-104.0f));
    __m256i n;
    __m256 y = sg_expcore8(xc, &n);
    __m256i n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
    return _mm256_blendv_ps(x, y, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
}

static inline __attribute__((always_inline)) __m256 sg_erf8(__m256 x) {
    __m256 c = _mm256_max_ps(_mm256_min_ps(x, SG_C8(3.92f)), SG_C8(-3.92f));
    __m256 t = _mm256_mul_ps(c, c);
    __m256 r = GE_ERF_RATIO(_mm256_fmadd_ps, _mm256_mul_ps, _mm256_div_ps, SG_C8, c, t);
    r = _mm256_max_ps(_mm256_min_ps(r, SG_C8(1.0f)), SG_C8(-1.0f));
    return _mm256_blendv_ps(x, r, _mm256_cmp_ps(x, x, _CMP_ORD_Q));
}

static inline __attribute__((always_inline)) __m256 sg_expneg8(__m256 v) {
    __m256 xc = _mm256_max_ps(SG_C8(-80.0f), _mm256_min_ps(SG_C8(88.8f), _mm256_sub_ps(_mm256_setzero_ps(), v)));
    __m256i n;
    __m256 y = sg_expcore8(xc, &n);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)));
}

static inline __attribute__((always_inline)) __m256 sg_act8(__m256 v, int64_t act) {
    if (act == 1) return _mm256_div_ps(SG_C8(1.0f), _mm256_add_ps(SG_C8(1.0f), sg_expneg8(v)));
    if (act == 2) return _mm256_div_ps(v, _mm256_add_ps(SG_C8(1.0f), sg_expneg8(v)));
    if (act == 3)
        return _mm256_mul_ps(_mm256_mul_ps(SG_C8(0.5f), v), _mm256_add_ps(SG_C8(1.0f), sg_erf8(_mm256_mul_ps(v, SG_C8(0.70710678118654752f)))));
    if (act == 4) {
        __m256 u2 = _mm256_mul_ps(v, _mm256_fmadd_ps(SG_C8(0.0713548162726f), _mm256_mul_ps(v, v), SG_C8(1.5957691216057308f)));
        return _mm256_div_ps(v, _mm256_add_ps(SG_C8(1.0f), sg_expneg8(u2)));
    }
    if (act == 5) {
        __m256 g = _mm256_fmadd_ps(v, SG_C8(1.0f / 6.0f), SG_C8(0.5f));
        g = _mm256_min_ps(SG_C8(1.0f), _mm256_max_ps(SG_C8(0.0f), g));
        return _mm256_mul_ps(v, g);
    }
    return v;
}
#endif
