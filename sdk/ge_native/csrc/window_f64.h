/* The float64 form of ge_cpu's sliding-window loops (plugins/ge_cpu/kernels/_window.py): they clip
   only (the activations run as the caller's epilogue). */
#include "prelude.h"
typedef double S;
#define NPY_S NPY_DOUBLE
#define FMA fma

static inline __attribute__((always_inline)) double EPI(double v, int64_t act, double lo, double hi) {
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return act == 0 ? v : v;
}

static void EPI_PLANE(double *o, int64_t count, int64_t act, double lo, double hi) {
    for (int64_t j = 0; j < count; j++) o[j] = EPI(o[j], act, lo, hi);
}
#include "window.h"
