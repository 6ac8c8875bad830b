/* the blocked kernels' vector type (ge_native.nchwc): a block of 16 channels as one value, and
   the register tiles' sizes, for AVX-512F or AVX2 + FMA (NC_VEC undefined elsewhere) */
#include "activations16.h"
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#define NC_AI static inline __attribute__((always_inline))

/* A block's 16 channels as one value `nv`: an AVX-512 register, or on AVX2 (with FMA) a pair of
   8-lane ones, the same math lane for lane (the layout, the packed weights and the order of
   every sum are the same on both: an .om blocked on one runs on the other with the same bits).
   `nb` is a broadcast input value: one register either way. The tile shapes differ: AVX-512 has
   32 registers (a tile of up to 4 blocks), AVX2 16 (12 sums: one block x 6 pixels, or two x 3
   in nc_tile8). */
#if defined(__AVX512F__)
#define NC_VEC 2
typedef __m512 nv;
typedef __m512 nb;
NC_AI nv nv_zero(void) { return _mm512_setzero_ps(); }
NC_AI nv nv_set1(float v) { return _mm512_set1_ps(v); }
NC_AI nv nv_load(const float *p) { return _mm512_loadu_ps(p); }
NC_AI void nv_store(float *p, nv v) { _mm512_storeu_ps(p, v); }
NC_AI nv nv_add(nv a, nv b) { return _mm512_add_ps(a, b); }
NC_AI nv nv_sub(nv a, nv b) { return _mm512_sub_ps(a, b); }
NC_AI nv nv_mul(nv a, nv b) { return _mm512_mul_ps(a, b); }
NC_AI nv nv_min(nv a, nv b) { return _mm512_min_ps(a, b); }
NC_AI nv nv_max(nv a, nv b) { return _mm512_max_ps(a, b); }
NC_AI nv nv_fma(nv a, nv b, nv c) { return _mm512_fmadd_ps(a, b, c); }
NC_AI nb nb_set1(float v) { return _mm512_set1_ps(v); }
NC_AI nv nv_fmab(nb a, nv b, nv c) { return _mm512_fmadd_ps(a, b, c); }
NC_AI nv nv_act(nv v, int64_t act) { return sg_act16(v, act); }
#define NC_FT(FB) (FB)     /* output blocks a register tile holds, of a group of FB (W2 unused) */
#define NC_FTP(FB) (FB)    /* ... the stem's (an NCHW input) */
#define NC_PC4 6           /* pixels a tile of 4, 3, 2 and 1 blocks (stride 1) */
#define NC_PC3 8
#define NC_PC2 12
#define NC_PC1 24
#define NC_PCS 8           /* ... and at a stride */
#define NC_DWMAX 12        /* pixels a depthwise tile */
#define NC_WBATCH 4096     /* floats of weight a batch of input blocks keeps in L1 */
#elif defined(__AVX2__) && defined(__FMA__)
#define NC_VEC 1
typedef struct { __m256 a, b; } nv;
typedef __m256 nb;
NC_AI nv nv_mk(__m256 a, __m256 b) { nv r; r.a = a; r.b = b; return r; }
NC_AI nv nv_zero(void) { return nv_mk(_mm256_setzero_ps(), _mm256_setzero_ps()); }
NC_AI nv nv_set1(float v) { __m256 s = _mm256_set1_ps(v); return nv_mk(s, s); }
NC_AI nv nv_load(const float *p) { return nv_mk(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
NC_AI void nv_store(float *p, nv v) { _mm256_storeu_ps(p, v.a); _mm256_storeu_ps(p + 8, v.b); }
NC_AI nv nv_add(nv x, nv y) { return nv_mk(_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)); }
NC_AI nv nv_sub(nv x, nv y) { return nv_mk(_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)); }
NC_AI nv nv_mul(nv x, nv y) { return nv_mk(_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)); }
NC_AI nv nv_min(nv x, nv y) { return nv_mk(_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)); }
NC_AI nv nv_max(nv x, nv y) { return nv_mk(_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)); }
NC_AI nv nv_fma(nv x, nv y, nv z) { return nv_mk(_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)); }
NC_AI nb nb_set1(float v) { return _mm256_set1_ps(v); }
NC_AI nv nv_fmab(nb x, nv y, nv z) { return nv_mk(_mm256_fmadd_ps(x, y.a, z.a), _mm256_fmadd_ps(x, y.b, z.b)); }
NC_AI nv nv_act(nv v, int64_t act) { return nv_mk(sg_act8(v.a, act), sg_act8(v.b, act)); }
#define NC_FT(FB) ((W2) && (FB) % 2 == 0 ? 2 : 1)  /* W2: nc_rows_fb's choice of the two-block tile */
#define NC_FTP(FB) 1
#define NC_PC4 6
#define NC_PC3 6
#define NC_PC2 6
#define NC_PC1 6
#define NC_PCS 6
#define NC_DWMAX 6
#define NC_WBATCH 4096
#endif
