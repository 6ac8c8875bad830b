/* CBLAS's gemm function types. build() gets them from ge_native.gemm.blas_decls() (the integer
   type of NumPy's BLAS), put before the source, which defines GE_BLAS_DECLS; these stand in when
   the file is compiled alone (the suite's syntax check) */
#ifndef GE_BLAS_DECLS
#define GE_BLAS_DECLS 1
#include <stdint.h>
typedef int blasint;
typedef void (*gemm_f32_t)(blasint, blasint, blasint, blasint, blasint, blasint, float, const float *,
                           blasint, const float *, blasint, float, float *, blasint);
typedef void (*gemm_f64_t)(blasint, blasint, blasint, blasint, blasint, blasint, double, const double *,
                           blasint, const double *, blasint, double, double *, blasint);
#endif
