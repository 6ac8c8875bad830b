/* The float32 form of ge_cpu's sliding-window loops (plugins/ge_cpu/kernels/_window.py): the
   scalar type S, its NumPy number, its multiply-add (one rounding), and the epilogue on the output
   plane: EPI(v) clips, then applies activation `act`; EPI_PLANE(o, count, ..) does it to a plane
   after the copy-out, 16 lanes at a time in AVX-512 registers (8 in AVX2 ones) where the compiler
   targets it (GE's GEMM's C of the activations, one home). */
#include "prelude.h"
#include "activations.h"
#include "activations16.h"
typedef float S;
#define NPY_S NPY_FLOAT
#define FMA fmaf

static inline __attribute__((always_inline)) float EPI(float v, int64_t act, float lo, float hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return act32(v, act);
}

static void EPI_PLANE(float *o, int64_t count, int64_t act, float lo, float hi) {
#if defined(__AVX512F__)
    /* (max and min return their second operand when either is NaN: a NaN stays NaN, as in EPI) */
    __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    int64_t j = 0;
    for (; j + 16 <= count; j += 16) {
        __m512 v = _mm512_min_ps(hiv, _mm512_max_ps(lov, _mm512_loadu_ps(o + j)));
        _mm512_storeu_ps(o + j, act ? sg_act16(v, act) : v);
    }
    if (j < count) {
        float t[16] __attribute__((aligned(64))) = {0};
        memcpy(t, o + j, (size_t)(count - j) * sizeof(float));
        __m512 v = _mm512_min_ps(hiv, _mm512_max_ps(lov, _mm512_load_ps(t)));
        _mm512_store_ps(t, act ? sg_act16(v, act) : v);
        memcpy(o + j, t, (size_t)(count - j) * sizeof(float));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    /* (the same on 8 lanes: sg_act8) */
    __m256 lov = _mm256_set1_ps(lo), hiv = _mm256_set1_ps(hi);
    int64_t j = 0;
    for (; j + 8 <= count; j += 8) {
        __m256 v = _mm256_min_ps(hiv, _mm256_max_ps(lov, _mm256_loadu_ps(o + j)));
        _mm256_storeu_ps(o + j, act ? sg_act8(v, act) : v);
    }
    if (j < count) {
        float t[8] __attribute__((aligned(32))) = {0};
        memcpy(t, o + j, (size_t)(count - j) * sizeof(float));
        __m256 v = _mm256_min_ps(hiv, _mm256_max_ps(lov, _mm256_load_ps(t)));
        _mm256_store_ps(t, act ? sg_act8(v, act) : v);
        memcpy(o + j, t, (size_t)(count - j) * sizeof(float));
    }
#else
    for (int64_t j = 0; j < count; j++) o[j] = EPI(o[j], act, lo, hi);
#endif
}
#include "window.h"
