"""The native kernel cache (ge_native.native): built once per machine, trusted only when it is the
user's own and intact, and giving the same results warm and cold."""

import json
import os
import pathlib
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ge_core import cache as ge_cache
from ge_native import native

#: a kernel that scales a float32 vector: out[i] = x[i] * k + 1
SRC = """
static PyObject *scale(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t count;
    if (ge_nargs(n, 3)) return NULL;
    const float *x = (const float *)ge_vec(args, 0, NPY_FLOAT, 0, &count);
    if (!x) return NULL;
    float *out = (float *)ge_arr(args, 1, NPY_FLOAT, 1, count);
    if (!out) return NULL;
    double k = PyFloat_AsDouble(args[2]);
    if (k == -1.0 && PyErr_Occurred()) return NULL;
    for (int64_t i = 0; i < count; i++) out[i] = x[i] * (float)k + 1.0f;
    Py_RETURN_NONE;
}
"""

CHILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    from ge_native import native
    src = open(sys.argv[1]).read()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mod = native.build(src, ["scale"])
    x = np.arange(5, dtype=np.float32)
    out = np.empty_like(x)
    mod.scale(x, out, 2.0)
    print(json.dumps({"stats": native.stats(), "out": out.tolist(), "file": mod.__file__,
                      "warnings": [str(m.message) for m in w], "numba": "numba" in sys.modules}))
""")


def test_native_kernels_are_available():
    assert native.available(), "no C compiler or Python/NumPy headers (or GE_NATIVE=0 is set)"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("GE_CACHE_DIR", str(root))
    src = tmp_path / "k.c"
    # a constant of this test's own: no other test's entry has its key
    src.write_text(SRC.replace("1.0f", f"{1 + len(str(tmp_path)) % 7}.0f"))
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    def run(**env):
        r = subprocess.run([sys.executable, str(script), str(src)], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=300, check=True)
        return json.loads(r.stdout)

    return root, run


def entry_files(root):
    d = root / f"v{ge_cache.FORMAT}"
    return sorted(p for p in d.iterdir() if p.suffix in (".so", ".sum") and not p.name.startswith("."))


def test_a_second_process_loads_the_kernel_without_compiling(cache):
    root, run = cache
    first = run()
    assert first["stats"]["compiled"] == 1 and first["stats"]["cached"] == 0
    second = run()
    assert second["stats"]["compiled"] == 0 and second["stats"]["cached"] == 1
    assert second["out"] == first["out"] and second["numba"] is False
    d = root / f"v{ge_cache.FORMAT}"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for p in entry_files(root):
        assert not p.stat().st_mode & 0o077, p


@pytest.mark.parametrize("damage", ["truncated", "garbled", "sum-garbled", "sum-missing"])
def test_a_corrupt_entry_is_rebuilt_not_loaded(cache, damage):
    root, run = cache
    first = run()
    want = first["out"]
    so = pathlib.Path(first["file"])  # this test's kernel (the cache also holds the native pool)
    total = so.with_suffix(".sum")
    if damage == "truncated":
        so.write_bytes(so.read_bytes()[:100])
    elif damage == "garbled":
        data = bytearray(so.read_bytes())
        data[len(data) // 2] ^= 0xFF
        so.write_bytes(bytes(data))
    elif damage == "sum-garbled":
        total.write_text("0" * 64 + "\n")
    else:
        total.unlink()
    again = run()
    assert again["stats"]["rebuilt"] == 1 and again["stats"]["compiled"] == 1 and again["stats"]["cached"] == 0
    assert again["out"] == want
    assert run()["stats"]["cached"] == 1  # the rebuilt entry is good


def test_a_world_writable_entry_is_rebuilt(cache):
    root, run = cache
    so = pathlib.Path(run()["file"])
    os.chmod(so, 0o666)
    again = run()
    assert again["stats"]["rebuilt"] == 1 and again["stats"]["cached"] == 0
    assert not so.stat().st_mode & 0o022


def test_a_foreign_owned_entry_is_not_trusted(cache, monkeypatch, tmp_path):
    root, run = cache
    so = pathlib.Path(run()["file"])
    if os.geteuid() == 0:
        os.chown(so, 4242, 4242)  # another user's file in the cache folder
        again = run()
        assert again["stats"]["rebuilt"] == 1 and again["stats"]["cached"] == 0
        assert so.stat().st_uid == 0
    # as another user, the whole folder (and so every entry in it) is not this user's: nothing
    # is loaded from it, kernels are built into a private folder for this process
    monkeypatch.setattr(ge_cache, "current_uid", lambda: os.geteuid() + 1)
    monkeypatch.setenv("GE_CACHE_DIR", str(root))
    with pytest.warns(UserWarning, match="is not used"):
        d = ge_cache.cache_dir()
    assert not d.startswith(str(root))
    mod = native.build((tmp_path / "k.c").read_text(), ["scale"])
    out = np.empty(3, np.float32)
    mod.scale(np.ones(3, np.float32), out, 1.0)
    assert mod.__file__.startswith(d)


def test_a_world_writable_cache_folder_of_ours_is_made_private(cache):
    root, run = cache
    run()
    d = root / f"v{ge_cache.FORMAT}"
    os.chmod(d, 0o777)
    assert run()["stats"]["cached"] == 1
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_another_compiler_does_not_use_the_entries_of_this_one(cache, tmp_path):
    root, run = cache
    run()
    wrapper = tmp_path / "other-cc"
    wrapper.write_text(f"#!/bin/sh\nexec {native.compiler()} \"$@\"\n")
    wrapper.chmod(0o755)
    other = run(GE_CC=str(wrapper))
    assert other["stats"]["compiled"] == 1 and other["stats"]["cached"] == 0
    assert run()["stats"]["cached"] == 1  # the first compiler's entry is still there and used


def test_the_key_covers_the_abi_numpy_the_prelude_and_the_source(monkeypatch):
    k = native.key_for(SRC)
    assert k == native.key_for(SRC) and k != native.key_for(SRC + " ")
    # the prelude (exp32, ge_parallel, ...) is compiled into every module: an upgraded prelude
    # must never load a module built from the old one
    monkeypatch.setattr(native, "PRELUDE", native.PRELUDE + "\n/* changed */\n")
    assert native.key_for(SRC) != k
    monkeypatch.undo()
    monkeypatch.setattr(native, "ABI", native.ABI + 1)
    assert native.key_for(SRC) != k
    monkeypatch.setattr(native, "ABI", native.ABI - 1)
    monkeypatch.setattr(np, "__version__", "0.0.0")
    assert native.key_for(SRC) != k


def test_kernel_entries_check_their_arguments():
    mod = native.build(SRC, ["scale"])
    x = np.arange(4, dtype=np.float32)
    with pytest.raises(TypeError, match="arguments"):
        mod.scale(x, x)
    with pytest.raises(TypeError, match="ndarray"):
        mod.scale([1.0, 2.0], x, 1.0)
    with pytest.raises(TypeError, match="dtype"):
        mod.scale(x.astype(np.float64), x, 1.0)
    with pytest.raises(TypeError, match="read-only"):
        ro = np.zeros(4, np.float32)
        ro.setflags(write=False)
        mod.scale(x, ro, 1.0)
    with pytest.raises(ValueError, match="elements"):
        mod.scale(x, np.zeros(3, np.float32), 1.0)  # the loop would write past the output
    with pytest.raises(TypeError, match="layout"):
        mod.scale(np.arange(8, dtype=np.float32)[::2], x, 1.0)


def test_native_off_switch(monkeypatch):
    monkeypatch.setenv("GE_NATIVE", "0")
    assert not native.available()
    assert native.build(SRC.replace("scale", "scale2"), ["scale2"]) is None


def test_a_source_the_compiler_refuses_warns_once_and_returns_none():
    bad = "static PyObject *oops(PyObject *self, PyObject *const *args, Py_ssize_t n) { return undefined_thing; }\n"
    with pytest.warns(RuntimeWarning, match="did not compile"):
        assert native.build(bad, ["oops"]) is None


def test_the_native_pool_survives_a_fork():
    # a forked child (multiprocessing's default on Linux) has none of the pool's workers: its
    # parallel loops run on the caller alone, with the same results, and never wait for them
    import multiprocessing as mp

    from ge_cpu.fused import codegen
    from ge_native import parallel

    prog = codegen.dumps([("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a1"], {})])
    fn = codegen.compile_program(prog, ["float32"] * 2, [(512, 1024), (1024,)], "float32", (512, 1024), mode="loop")
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(1024).astype(np.float32)
    with parallel.use_threads(2):
        want = fn(x, b)  # the parent's pool has started its worker
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()

    def work(conn):
        with parallel.use_threads(2):
            conn.send(bool(np.array_equal(fn(x, b), want)))

    p = ctx.Process(target=work, args=(child,))
    p.start()
    assert parent.poll(60), "the forked child hung in the native pool"
    assert parent.recv() is True
    p.join(10)


def test_vector_kernels_build_for_the_cpus_instruction_set():
    """GE's GEMM and the blocked convolutions build for AVX-512F where the CPU has it, else for
    AVX2 + FMA (the same packing and sums), else not at all: no x86 machine with AVX2 is left on
    the slow paths. Without a C compiler neither builds; without /proc/cpuinfo the two agree."""
    from ge_native import nchwc, sgemm

    flags = native.cpu_flags()
    if not native.available():
        want = None
    elif flags is None:
        want = sgemm.isa()
    else:
        want = "avx512f" if "avx512f" in flags else ("avx2" if {"avx2", "fma"} <= flags else None)
    assert sgemm.isa() == want
    assert nchwc.isa() == want


def test_packed_weights_start_on_a_cache_line():
    """The vector kernels stream packed weights a register at a time: each pack starts on a
    64-byte line (NumPy alone gives 16), with the values of the NumPy packing."""
    from ge_native import nchwc, sgemm

    rng = np.random.default_rng(0)
    w4 = rng.standard_normal((40, 24, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((29, 37)).astype(np.float32)  # (k, n): two panels, the second of 5 columns
    packs = [nchwc.pack_weights(w4), nchwc.pack_weights(rng.standard_normal((64, 16, 3, 3)).astype(np.float32),
                                                         groups=2),
             nchwc.pack_plain(w4), nchwc.pack_depthwise(w4[:, :1]), sgemm.Panels(w2).data, sgemm.RowPanels(w2).data]
    for p in packs:
        assert p.ctypes.data % 64 == 0 and p.flags.c_contiguous and p.dtype == np.float32
    # the values: a Panels' panel p is columns [32p, 32p + 32) of the matrix, zero-padded
    panels = sgemm.Panels(w2).data
    np.testing.assert_array_equal(panels[0], w2[:, :32])
    np.testing.assert_array_equal(panels[1][:, :5], w2[:, 32:])
    assert not panels[1][:, 5:].any()
    got = native.aligned(np.arange(10.0).reshape(2, 5).T)
    assert got.ctypes.data % 64 == 0 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.arange(10.0).reshape(2, 5).T)


POOL_PROBE = """
static void probe_task(void *vc, int64_t i, int slot) {
    int64_t *c = (int64_t *)vc;
    volatile double s = 0;
    for (int k = 0; k < 2000; k++) s += k;  /* long enough that both participants take tasks */
    __atomic_fetch_add(&c[i], 1, __ATOMIC_RELAXED);
    c[c[-1] + i] = slot;
}
static PyObject *probe(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    int64_t tasks, threads;
    if (ge_nargs(n, 3) || ge_int(args, 1, 1, 1 << 20, &tasks) || ge_int(args, 2, 1, 64, &threads)) return NULL;
    int64_t *c = (int64_t *)ge_arr(args, 0, NPY_INT64, 1, 2 * tasks + 1);
    if (!c) return NULL;
    c[0] = tasks;
    Py_BEGIN_ALLOW_THREADS
    ge_parallel(probe_task, c + 1, tasks, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
"""


@pytest.mark.parametrize("tasks", [1, 2, 3, 7, 64, 4096, 4097, 9000])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_native_pool_runs_every_task_once_on_a_valid_slot(tasks, threads):
    """Jobs of up to 4096 tasks are shared out in ranges (each participant's own first, then
    the rest claimed task by task), larger ones claimed from a counter: either way every task
    runs exactly once, on a slot below the thread count. (Which slot runs a task is not fixed: a
    worker that finishes its range while the caller is still waking it takes the caller's tasks.)"""
    mod = native.build(POOL_PROBE, ["probe"])
    assert mod is not None
    for _ in range(3):
        buf = np.zeros(2 * tasks + 1, np.int64)
        mod.probe(buf, tasks, threads)
        counts, slots = buf[1:tasks + 1], buf[tasks + 1:]
        assert (counts == 1).all()
        assert ((slots >= 0) & (slots < threads)).all()
