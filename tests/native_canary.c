/* The canary kernel of the cache-trust tests and the cache fuzz target:
   out[i] = x[i] * k + ADDf, where the test replaces ADDf by a float literal (the real kernel's
   and an impostor's differ, so a call tells which module was loaded). Compiled after
   ge_sdk.native's prelude (ge_nargs, ge_vec, ge_arr). */
static PyObject *canary(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t count;
    if (ge_nargs(n, 3)) return NULL;
    const float *x = (const float *)ge_vec(args, 0, NPY_FLOAT, 0, &count);
    if (!x) return NULL;
    float *out = (float *)ge_arr(args, 1, NPY_FLOAT, 1, count);
    if (!out) return NULL;
    double k = PyFloat_AsDouble(args[2]);
    if (k == -1.0 && PyErr_Occurred()) return NULL;
    for (int64_t i = 0; i < count; i++) out[i] = x[i] * (float)k + ADDf;
    Py_RETURN_NONE;
}
