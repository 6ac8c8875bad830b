/* the float32 build of fused_rows.c */
typedef float T;
#define NPY_T NPY_FLOAT
#define ONE 1.0f
#define SQRT sqrtf
#define EXP expneg32
