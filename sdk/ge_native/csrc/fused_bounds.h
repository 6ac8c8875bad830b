/* Max and min against a bound that is a parameter of a generated elementwise loop
   (ge_cpu.fused.loopgen: a fake-quant's range, a Clip's bounds), put before the loops that have
   parameters. The generator passes only finite bounds, so the bound's NaN test of the prelude's
   ge_max32/ge_min32 is left out: the results are theirs (a NaN operand passes through, a zero
   keeps its sign), and the select vectorises. With that test on a bound the compiler cannot see
   is a number, GCC does not if-convert the loop and it runs scalar (17x slower). */
static inline float ge_maxk32(float a, float b) { return a < b ? b : a; }
static inline float ge_mink32(float a, float b) { return a > b ? b : a; }
static inline double ge_maxk64(double a, double b) { return a < b ? b : a; }
static inline double ge_mink64(double a, double b) { return a > b ? b : a; }
