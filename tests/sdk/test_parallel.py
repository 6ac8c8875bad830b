"""GE's thread pool (ge_native.parallel) and its native GEMM path (ge_native.gemm)."""

import multiprocessing
import os
import threading

import numpy as np
import pytest
import threadpoolctl

from ge_native import gemm, parallel


@pytest.fixture(autouse=True)
def _blas_at_one_thread():
    """As inside a run (parallel=engine): BLAS at one thread, so each block's product is one
    single-threaded call and the bits do not depend on how BLAS would split it."""
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        yield


def test_width_is_one_outside_runs_and_clamped_to_the_cores():
    assert parallel.threads() == 1
    with parallel.use_threads(10_000) as w:
        assert w == parallel.threads() == min(parallel.MAX_THREADS, os.cpu_count() or 1)
        with parallel.use_threads(None):
            assert parallel.threads() == 1
    assert parallel.threads() == 1


def test_parallel_for_runs_every_task_once_and_raises_the_first_error():
    seen: list[int] = []
    lock = threading.Lock()

    def task(i):
        with lock:
            seen.append(i)

    with parallel.use_threads(2):
        parallel.parallel_for(37, task)
    assert sorted(seen) == list(range(37))

    def bad(i):
        if i == 5:
            raise KeyError("task 5")

    with parallel.use_threads(2), pytest.raises(KeyError, match="task 5"):
        parallel.parallel_for(9, bad)


def test_a_task_that_splits_again_runs_its_tasks_inline():
    inner: list[int] = []

    def outer(i):
        parallel.parallel_for(3, lambda j: inner.append(i * 10 + j))  # no deadlock, no nesting

    with parallel.use_threads(2):
        parallel.parallel_for(4, outer)
    assert sorted(inner) == sorted(i * 10 + j for i in range(4) for j in range(3))


@pytest.mark.parametrize("size,cost,align,most", [(1000, 5e3, 1, 32), (1024, 4096, 64, 8), (7, 1e9, 1, 4), (300, 1, 1, 8)])
def test_chunks_cover_the_range_aligned_and_depend_on_sizes_only(size, cost, align, most):
    parts = parallel.chunks(size, cost, align=align, most=most)
    assert parts[0][0] == 0 and parts[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert len(parts) <= most and all(lo < hi for lo, hi in parts)
    assert all((hi - lo) % align == 0 for lo, hi in parts[:-1])
    with parallel.use_threads(2):
        assert parallel.chunks(size, cost, align=align, most=most) == parts


def test_native_gemm_is_available_here():
    # numba is a dependency, gcc (and its libgomp) is on every machine: the fast path must work
    assert gemm.available(), "numba's thread-safe layer or NumPy's CBLAS sgemm was not found"
    assert gemm.cblas(np.float32) is not None and gemm.cblas(np.float64) is not None


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,k,n", [(128, 256, 1024), (197, 192, 576), (8, 33, 129), (3, 64, 256), (128, 64, 48),
                                   (1568, 48, 48), (392, 96, 96)])  # the last three: rows split
def test_packed_weight_matches_numpy_and_has_the_same_bits_at_every_width(m, k, n, dtype):
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((2, m, k)).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    pw = parallel.PackedWeight(w, rows=2 * m)
    assert sum(b.shape[1] for b in pw.blocks) == n and all(b.flags.c_contiguous for b in pw.blocks)
    assert pw.split == ("rows" if 2 * m >= 2 * n else "cols")
    if pw.split == "rows" and 2 * m * n * k >= 2 * pw.BLOCK_MACS:
        assert len(pw.row_cuts(2 * m)) % 2 == 0  # an even count of row tasks: two threads share them equally
    want = a @ w + bias
    got1 = pw.matmul(a, bias=bias)
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(got1, want, rtol=tol, atol=tol * np.sqrt(k))
    with parallel.use_threads(2):
        out = np.full((2, m, n), np.nan, dtype)
        got2 = pw.matmul(a, out=out, bias=bias)
    assert got2 is out
    np.testing.assert_array_equal(got2, got1)  # the blocks, not who runs them, decide the bits
    np.testing.assert_array_equal(pw.whole, w)
    with pytest.raises(ValueError, match="does not fit"):
        pw.matmul(a[..., :-1])


def test_matmul_splits_only_when_wider_than_one_and_reads_strided_operands():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((256, 300)).astype(np.float32)
    b_full = rng.standard_normal((300, 2048)).astype(np.float32)
    b = b_full[:, ::2]  # strided columns: the Python pool path
    bc = b_full[:, :1024]  # row stride 2048: BLAS reads it in place (native path)
    want = a @ b
    with parallel.use_threads(2):
        np.testing.assert_allclose(parallel.matmul(a, b), want, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(parallel.matmul(a, bc), a @ bc, rtol=1e-4, atol=1e-3)
        x3 = rng.standard_normal((3, 300, 1024)).astype(np.float32)  # (m, k) @ (batch, k, n): a conv's GEMM
        np.testing.assert_allclose(parallel.matmul(a, x3), np.matmul(a, x3), rtol=1e-4, atol=1e-3)
        q = rng.standard_normal((4, 128, 64)).astype(np.float32)
        kt = rng.standard_normal((4, 64, 128)).astype(np.float32)
        np.testing.assert_allclose(parallel.matmul(q, kt), q @ kt, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(parallel.matmul(a, bc), np.matmul(a, bc))  # width 1: NumPy's own call


def test_run_cols_refuses_what_blas_cannot_read_in_place():
    a = np.ones((16, 8), np.float32)
    b = np.ones((8, 64), np.float32)
    out = np.empty((16, 64), np.float32)
    assert gemm.run_cols(a, b, out, [(0, 32), (32, 64)], 2)
    np.testing.assert_array_equal(out, a @ b)
    assert not gemm.run_cols(a, b[:, ::2], np.empty((16, 32), np.float32), [(0, 32)], 2)  # column stride
    assert not gemm.run_cols(a, b, out, [(0, 30), (32, 64)], 2)  # cuts with a gap
    assert not gemm.run_cols(a, b, np.empty((64, 16), np.float32).T, [(0, 64)], 2)  # output not C order
    assert not gemm.run_cols(a.astype(np.float64), b, out, [(0, 64)], 2)


def _child(conn):
    try:
        w = np.arange(64 * 512, dtype=np.float32).reshape(64, 512) / 1e4
        a = np.ones((128, 64), np.float32)
        with parallel.use_threads(2):
            got = parallel.PackedWeight(w, rows=128).matmul(a)
        conn.send((gemm.available(), bool(np.allclose(got, a @ w, rtol=1e-5))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(repr(e))


def test_a_forked_child_runs_the_python_pool():
    with parallel.use_threads(2):
        parallel.PackedWeight(np.ones((64, 512), np.float32), rows=128).matmul(np.ones((128, 64), np.float32))
    assert gemm.available()  # the native pool has started in this process
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_child, args=(child,))
    p.start()
    assert parent.poll(60), "the forked child hung"
    result = parent.recv()
    p.join(30)
    assert result == (False, True)  # GNU OpenMP did not survive the fork: the Python pool gave the answer


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_batched_matmul_runs_a_task_per_entry_with_the_same_bits_at_every_width_above_one(dtype):
    # a grouped convolution's GEMMs (wav2vec2's positional conv: 16 groups of (16, 2048) @ (2048, 49))
    rng = np.random.default_rng(11)
    a = rng.standard_normal((16, 16, 512)).astype(dtype)
    b = rng.standard_normal((16, 512, 49)).astype(dtype)
    with parallel.use_threads(2):
        two = parallel.matmul(a, b)
    # against NumPy's own call (one thread) at a tolerance: how NumPy batches is its business
    np.testing.assert_allclose(two, np.matmul(a, b), rtol=1e-4 if dtype == "float32" else 1e-10, atol=1e-3)
    with parallel.use_threads(3):
        np.testing.assert_array_equal(parallel.matmul(a, b), two)  # the tasks, not the width, decide the bits
    assert gemm.run_batched(a, b, np.empty((16, 16, 49), dtype), 2)
    assert not gemm.run_batched(a, b[:, :, :48], np.empty((16, 16, 49), dtype), 2)  # shapes disagree
    assert not gemm.run_batched(a[:, :, ::2], b[:, :256], np.empty((16, 16, 49), dtype), 2)  # strided


def test_run_rows_checks_its_matrices_and_cuts():
    rng = np.random.default_rng(12)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32, 48)).astype(np.float32)
    bias = rng.standard_normal(48).astype(np.float32)
    out = np.empty((64, 48), np.float32)
    assert gemm.run_rows(a, b, out, [(0, 32), (32, 64)], 2, bias)
    np.testing.assert_allclose(out, a @ b + bias, rtol=1e-5, atol=1e-5)
    assert not gemm.run_rows(a, b[:, ::2], np.empty((64, 24), np.float32), [(0, 64)], 2)  # strided B
    assert not gemm.run_rows(a, b, np.empty((64, 47), np.float32), [(0, 64)], 2)  # C of the wrong width
    assert not gemm.run_rows(a, b, out, [(0, 30), (32, 64)], 2)  # cuts with a gap
    assert not gemm.run_rows(a, b, out, [(0, 64)], 2, bias[:40])  # a bias too short
