"""The native target's generated loops and row kernels, instance norm and erf, and the replay of
recorded raw calls with one argument changed."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from native_entries_gemm import e_sgemm_conv, e_sgemm_packed
from native_entries_layout import e_nchwc
from native_inputs import (
    CLEAN,
    NativeRefused,
    _raw_call,
    arr,
    close,
    dim,
    hostile_array,
    refused,
    through_wrapper,
    weird_int,
)

_BN_RELU: list[tuple[str, list[str], dict[str, Any]]] = [("Mul", ["a0", "a1"], {}), ("Add", ["t0", "a2"], {}), ("Relu", ["t1"], {}), ("Sub", ["t2", "a1"], {})]


_LOOPS: dict = {}


def e_loop(rng, hostile):
    from ge_cpu.fused import loopgen

    if not loopgen.available():
        raise refused("loop", "not built here")
    dt = rng.choice(["float32", "float64"])
    lead = [dim(rng, 6), dim(rng, 9)]
    c, hw = dim(rng, 9), dim(rng, 30)
    pattern = rng.choice(["full", "channel", "scalar"])
    full = tuple(lead[:1] + [c, hw])
    shapes = {"full": [full, full, full], "channel": [full, (c, 1), (c, 1)], "scalar": [full, (), ()]}[pattern]
    dynamic = rng.random() < 0.4
    key = (dt, pattern, tuple(shapes) if not dynamic else None, dynamic)
    fn = _LOOPS.get(key)
    if fn is None and key not in _LOOPS:
        if dynamic:
            sym = {"full": [("N", "C", "H")] * 3, "channel": [("N", "C", "H"), ("C", 1), ("C", 1)],
                   "scalar": [("N", "C", "H"), (), ()]}[pattern]
            fn = loopgen.loop_kernel_dynamic(_BN_RELU, ["a0", "a1", "a2"], [dt] * 3, sym, dt, ("N", "C", "H"))
        else:
            fn = loopgen.loop_kernel(_BN_RELU, ["a0", "a1", "a2"], [dt] * 3, shapes, dt, full)
        if len(_LOOPS) > 200:
            _LOOPS.clear()
        _LOOPS[key] = fn
    if fn is None:
        raise refused("loop", "no loop form")
    xs = [arr(rng, s, dt) for s in shapes]
    what = ""
    out = None
    if hostile:
        r = rng.randrange(3)
        if r == 0:
            i = rng.randrange(3)
            xs[i], what = hostile_array(rng, xs[i])
        elif r == 1:
            out, what = hostile_array(rng, np.zeros(full, dt))
        else:
            xs, what = xs[:2], "operands"
    got = through_wrapper("loop", what, lambda: fn(*xs, out=out) if out is not None else fn(*xs))
    if not what:
        x64 = [np.asarray(x, np.float64) for x in xs]
        close("loop", got, np.maximum(x64[0] * x64[1] + x64[2], 0) - x64[1], 1e-5)
    return "loop:" + ("dynamic" if dynamic else "static")


def e_loop_raw(rng, hostile):
    from ge_cpu.fused import loopgen

    dt = np.dtype(rng.choice(["float32", "float64"]))
    built = _LOOPS.get(("raw", dt.name))
    if built is None:
        built = _LOOPS[("raw", dt.name)] = loopgen._compile(_BN_RELU, ["a0", "a1", "a2"], dt, (1, 1, 1), ())
    if built is None:
        raise refused("loop", "no loop form")
    built, kvals = built  # the loop and its parameters' values (None: the program has none)
    d0, d1, d2 = dim(rng, 5), dim(rng, 5), dim(rng, 30)
    out = np.zeros(d0 * d1 * d2, dt)
    xs = [arr(rng, (d0 * d1 * d2,), dt) for _ in range(3)]
    args = [d0, d1, d2, out, d1 * d2, d2]
    for x in xs:
        args += [x, d1 * d2, d2]
    args.append(rng.choice([1, 2]))
    if kvals is not None:
        args.append(kvals)
    return _raw_call("loop", built.kernel, args, rng, hostile)


def e_rows(rng, hostile):
    from ge_cpu.fused import loopgen

    kind = rng.choice(list(loopgen.ROW_KINDS))
    dt = rng.choice([np.float32, np.float64])
    fn = loopgen.row_kernel(kind, dt)
    if fn is None:
        raise refused("rows", "not built here")
    rows, cols = dim(rng, 40), dim(rng, 70)
    if kind == "rotary":
        cols -= cols % 2
    x = arr(rng, (rows, cols), dt)
    out = np.zeros((rows, cols), dt)
    g, b = arr(rng, (cols,), dt), arr(rng, (cols,), dt)
    P = rng.choice([1, rows]) if rows else 1
    params: list[Any] = {"layernorm": [g, b, 1e-5], "rmsnorm": [g, 1e-5], "softmax": [],
                         "rotary": [arr(rng, (P, cols), dt), arr(rng, (P, cols), dt), P],
                         "softmax_scaled": [0.5, arr(rng, (P, cols), dt) if rng.random() < 0.5 else
                                            np.zeros((0, cols), dt), P]}[kind]
    if kind == "softmax_scaled" and params[1].size == 0:
        params[2] = 0
    what = ""
    if hostile:
        r = rng.randrange(3)
        if r == 0:
            x, what = hostile_array(rng, x)
        elif r == 1:
            out, what = hostile_array(rng, out)
        elif params:
            i = rng.randrange(len(params))
            params[i] = hostile_array(rng, params[i])[0] if isinstance(params[i], np.ndarray) else weird_int(rng)
            what = "parameter"
        else:
            what = "none"
    if hostile and rng.random() < 0.3:  # the raw entry with rows, cols or threads of its own
        from ge_native import native

        key = ("rows-module", np.dtype(dt).name)
        if key not in _LOOPS:
            _LOOPS[key] = native.build(loopgen.row_source(dt),
                                       list(loopgen.ROW_KINDS))
        mod = _LOOPS[key]
        if mod is None:
            raise refused("rows", "not built here")
        ints = [rows, cols, 1]
        ints[rng.randrange(3)] = weird_int(rng)
        return _raw_call("rows_" + kind, getattr(mod, kind), [x, *params, out, *ints], rng, False)
    try:
        if what and rng.random() < 0.5:  # the raw entry itself (the shape as given)
            fn(x, *params, out)
        else:
            loopgen.by_rows(fn, x, out, *params)
    except CLEAN as e:
        raise refused("rows_" + kind, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("rows_" + kind, f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not what and rows and cols:
        x64 = x.astype(np.float64)
        if kind == "layernorm":
            mu = x64.mean(-1, keepdims=True)
            want = (x64 - mu) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * g + b
            close("rows_layernorm", out, want, 1e-3)
        elif kind == "softmax":
            ex = np.exp(x64 - x64.max(-1, keepdims=True))
            close("rows_softmax", out, ex / ex.sum(-1, keepdims=True), 1e-4)
    return "rows_" + kind


def e_misc(rng, hostile):
    from ge_cpu.kernels import elementwise, nn

    dt = np.dtype(rng.choice(["float32", "float64"]))
    if rng.random() < 0.5:
        fn = nn._instnorm_kernel(dt)
        if fn is None:
            raise refused("instnorm", "not built here")
        c = rng.choice([1, 2, 3])
        rows, cols = c * rng.choice([0, 1, 2]), dim(rng, 40)
        x = arr(rng, (rows, cols), dt)
        y = np.zeros_like(x)
        gb = np.concatenate([np.ones(c, dt), np.zeros(c, dt)])
        args = [x, y, gb, 1e-5, c, rng.choice([1, 2])]
        label = _raw_call("instnorm", fn, args, rng, hostile)
        if not hostile and rows and cols:
            x64 = x.astype(np.float64)
            want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
            close("instnorm", y, want, 2e-3)
        return label
    x = arr(rng, (rng.choice([0, 1, 63, 64, 65, 1000]),), dt)
    if rng.random() < 0.5:
        loop = elementwise._erf_loop(dt)
        if loop is None:
            raise refused("erf", "not built here")
        return _raw_call("erf", loop, [x, np.zeros_like(x)], rng, hostile)
    if hostile:
        x = hostile_array(rng, x)[0]
        if not isinstance(x, np.ndarray):
            raise refused("erf", "not an array")
    try:
        y = elementwise.erf(x)
    except CLEAN as e:
        raise refused("erf", e) from None
    if not hostile:
        from math import erf

        close("erf", y, np.array([erf(v) for v in x.astype(np.float64)]).reshape(x.shape), 1e-5)
    return "erf"


class _Recorder:
    """A stand-in for a built module that records the raw arguments of every entry call."""

    def __init__(self, mod: Any) -> None:
        self._mod = mod
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._mod, name)
        if not callable(fn) or name.endswith(("_ok", "_isa", "_width")):
            return fn

        def rec(*args):
            self.calls.append((name, args))
            return fn(*args)

        return rec


def _mutate_raw(rng, orig: tuple) -> list:
    """``args`` with one changed: an int to a weird one, an int64 vector's element (a geometry,
    offsets) to a weird value, an array made hostile, a float to NaN; or cut short."""
    args = list(orig)
    arrays = [j for j, x in enumerate(args) if isinstance(x, np.ndarray)]
    if len(arrays) >= 2 and rng.random() < 0.15:  # one array passed again where another belongs (aliasing)
        j, k = rng.sample(arrays, 2)
        args[j] = args[k]
        return args
    i = rng.randrange(len(args))
    a = args[i]
    if isinstance(a, np.ndarray) and a.dtype == np.int64 and a.size and rng.random() < 0.7:
        b = a.copy()
        b.reshape(-1)[rng.randrange(b.size)] = rng.choice([0, -1, 2, 2**20 + 1, 2**31, 2**40, 2**62, -(2**63)])
        args[i] = b
    elif isinstance(a, np.ndarray):
        args[i] = hostile_array(rng, a)[0]
    elif isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        args[i] = weird_int(rng) if rng.random() < 0.7 else int(a) + rng.choice([-1, 1])
    elif isinstance(a, float):
        args[i] = rng.choice([float("nan"), float("-inf"), -1.0])
    else:
        args[i] = rng.choice([None, 0, np.zeros(1, np.float32)])
    if rng.random() < 0.1:
        args = args[: rng.randrange(len(args))]
    return args


def e_replay(rng, hostile):
    """A valid wrapper call of sgemm or nchwc recorded, then its raw entry called again with one
    argument changed (the entries check every size, stride and attribute themselves)."""
    from ge_native import nchwc, sgemm

    which, run = rng.choice([(nchwc, e_nchwc), (sgemm, e_sgemm_conv), (sgemm, e_sgemm_packed)])
    mod = which._mod()
    if mod is None:
        raise refused("replay", "not built here")
    rec = _Recorder(mod)
    saved = which._mod
    which._mod = lambda: rec
    try:
        with contextlib.suppress(NativeRefused):  # a refused valid call records no less
            run(rng, False)
    finally:
        which._mod = saved
    if not rec.calls:
        raise refused("replay", "no entry called")
    name, args = rng.choice(rec.calls)
    fn = getattr(mod, name)
    try:
        fn(*(_mutate_raw(rng, args) if hostile else args))
    except CLEAN as e:
        raise refused(name, e) from None
    return name + ":replay"
