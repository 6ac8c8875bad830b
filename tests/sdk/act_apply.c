/* The activation test's entry (tests/sdk/test_activations.py): y = act(x) for each element,
   the activation chosen by code; the test puts one line per function of the activation table
   where CASES stands. Compiled after ge_native's prelude and activations.h. */

static PyObject *act_apply(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t len, len2, code;
    if (ge_nargs(n, 3)) return NULL;
    const float *x = ge_vec(args, 0, NPY_FLOAT, 0, &len);
    if (!x) return NULL;
    float *y = ge_vec(args, 1, NPY_FLOAT, 1, &len2);
    if (!y) return NULL;
    if (len2 != len) {
        PyErr_SetString(PyExc_ValueError, "act_apply: sizes differ");
        return NULL;
    }
    if (ge_int(args, 2, 0, 1000, &code)) return NULL;
    for (int64_t i = 0; i < len; i++) {
        float v = x[i];
/* CASES */
        y[i] = v;
    }
    Py_RETURN_NONE;
}
