/* the float64 build of fused_rows.c */
typedef double T;
#define NPY_T NPY_DOUBLE
#define ONE 1.0
#define SQRT sqrt
#define EXP exp
