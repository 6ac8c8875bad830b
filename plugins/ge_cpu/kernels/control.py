"""Control flow (If, Loop, Scan, SequenceMap) and ONNX sequence/optional ops.

Control-flow factories compile their bodies through ``spec.options["subgraph"]`` (provided by
the ge_cpu executor, see ``ge_cpu.executor``); the kernel receives the node's own inputs
followed by ``spec.options["n_captures"]`` captured outer values, which it hands to the body.
Sequences are Python lists of arrays; an empty optional is ``None``.

Every iteration of Loop, Scan and SequenceMap checks the run's deadline
(:func:`ge_core.kernel.check_deadline`); a Loop also stops at the iteration limit
(:func:`ge_core.kernel.max_loop_iterations`), each with an ExecutionError naming the node.
"""

from __future__ import annotations

import numpy as np

from ge_core.errors import RunCancelledError
from ge_core.kernel import KernelSpec, check_deadline, check_loop_iterations, max_loop_iterations

from ._util import ints, kernel_table, norm_axis, unsupported

KERNELS, _reg = kernel_table()


def _builder(spec: KernelSpec):
    build = spec.options.get("subgraph")
    if build is None:
        raise unsupported(spec, "a control-flow op outside the ge_cpu executor (no subgraph compiler)")
    return build


def _truth(a) -> bool:
    return bool(np.asarray(a).reshape(-1)[0])


def _stack(items: list, dtype) -> np.ndarray:
    if items:
        return np.stack([np.asarray(x) for x in items])
    return np.zeros((0,), dtype=dtype if dtype is not None else np.float32)


# ------------------------------------------------------------------------------------------
# If / Loop / Scan / SequenceMap
# ------------------------------------------------------------------------------------------
@_reg("If")
def if_factory(spec: KernelSpec):
    build = _builder(spec)
    then_p = build(spec.attr("then_branch"))
    else_p = build(spec.attr("else_branch"))
    if then_p.n_outputs != spec.num_outputs or else_p.n_outputs != spec.num_outputs:
        raise unsupported(spec, "branches whose output count differs from the node's")

    def kernel(cond, *caps):
        p = then_p if _truth(cond) else else_p
        return p.run((), caps)

    return kernel


@_reg("Loop")
def loop_factory(spec: KernelSpec):
    body = _builder(spec)(spec.attr("body"))
    n = len(spec.inputs)
    n_carried = n - 2
    n_scan = body.n_outputs - 1 - n_carried
    if n_scan < 0 or body.n_inputs != n_carried + 2:
        raise unsupported(spec, "a body whose inputs/outputs do not match the loop-carried values")
    scan_dtypes = [t.dtype if t is not None else None for t in spec.outputs[n_carried:]]

    name = spec.name

    def kernel(*ins):
        m, cond = ins[0], ins[1]
        vs = list(ins[2:n])
        caps = ins[n:]
        trips = None if m is None else int(np.asarray(m).reshape(-1)[0])
        keep = True if cond is None else _truth(cond)
        scans: list[list] = [[] for _ in range(n_scan)]
        limit = max_loop_iterations()
        i = 0
        while keep and (trips is None or i < trips):
            check_deadline(name)
            check_loop_iterations(name, i, limit)
            try:
                outs = body.run([np.array(i, dtype=np.int64), np.array(keep), *vs], caps)
            except RunCancelledError as e:
                raise e.inside(name, i) from None
            keep = _truth(outs[0])
            vs = outs[1:1 + n_carried]
            for k in range(n_scan):
                scans[k].append(outs[1 + n_carried + k])
            i += 1
        return tuple(vs) + tuple(_stack(s, dt) for s, dt in zip(scans, scan_dtypes))

    return kernel


def _scan_loop(name, body, states, xs, in_axes, in_dirs, out_axes, out_dirs, n_scan_out, caps, out_dtypes):
    states = list(states)
    steps = xs[0].shape[in_axes[0]] if xs else 0
    acc: list[list] = [[] for _ in range(n_scan_out)]
    idx = [(slice(None),) * ax for ax in in_axes]
    for t in range(steps):
        check_deadline(name)
        args = []
        for x, pre, d in zip(xs, idx, in_dirs):
            args.append(x[pre + ((steps - 1 - t) if d else t,)])
        try:
            res = body.run(states + args, caps)
        except RunCancelledError as e:
            raise e.inside(name, t) from None
        states = list(res[:len(states)])
        for k in range(n_scan_out):
            acc[k].append(res[len(states) + k])
    outs = []
    for k in range(n_scan_out):
        arr = _stack(acc[k], out_dtypes[k] if k < len(out_dtypes) else None)
        if out_dirs[k]:
            arr = arr[::-1]
        ax = norm_axis(out_axes[k], arr.ndim)
        if ax:
            arr = np.moveaxis(arr, 0, ax)
        outs.append(np.ascontiguousarray(arr))
    return states, outs


@_reg("Scan")
def scan_factory(spec: KernelSpec):
    body = _builder(spec)(spec.attr("body"))
    n_scan_in = int(spec.attr("num_scan_inputs"))
    n = len(spec.inputs)
    if spec.opset and spec.opset < 9:
        return _scan8(spec, body, n_scan_in, n)
    n_state = n - n_scan_in
    n_scan_out = body.n_outputs - n_state
    in_axes = ints(spec.attr("scan_input_axes")) or [0] * n_scan_in
    in_dirs = ints(spec.attr("scan_input_directions")) or [0] * n_scan_in
    out_axes = ints(spec.attr("scan_output_axes")) or [0] * n_scan_out
    out_dirs = ints(spec.attr("scan_output_directions")) or [0] * n_scan_out
    out_dtypes = [t.dtype if t is not None else None for t in spec.outputs[n_state:]]

    def kernel(*ins):
        xs = ins[n_state:n]
        axes = [norm_axis(a, np.ndim(x)) for a, x in zip(in_axes, xs)]
        states, outs = _scan_loop(spec.name, body, ins[:n_state], xs, axes, in_dirs, out_axes, out_dirs,
                                  n_scan_out, ins[n:], out_dtypes)
        return tuple(states) + tuple(outs)

    return kernel


def _scan8(spec: KernelSpec, body, n_scan_in: int, n: int):
    n_state = n - 1 - n_scan_in
    n_scan_out = body.n_outputs - n_state
    dirs = ints(spec.attr("directions")) or [0] * n_scan_in
    out_dtypes = [t.dtype if t is not None else None for t in spec.outputs[n_state:]]

    def kernel(*ins):
        lens = ins[0]
        states = ins[1:1 + n_state]
        xs = ins[1 + n_state:n]
        caps = ins[n:]
        batch = xs[0].shape[0] if xs else states[0].shape[0]
        st_out: list[list] = [[] for _ in range(n_state)]
        sc_out: list[list] = [[] for _ in range(n_scan_out)]
        for b in range(batch):
            ln = xs[0].shape[1] if lens is None else int(np.asarray(lens).reshape(-1)[b])
            sb, ob = _scan_loop(spec.name, body, [s[b] for s in states], [x[b, :ln] for x in xs], [0] * n_scan_in, dirs,
                                [0] * n_scan_out, [0] * n_scan_out, n_scan_out, caps, out_dtypes)
            for k in range(n_state):
                st_out[k].append(sb[k])
            for k in range(n_scan_out):
                sc_out[k].append(ob[k])
        return tuple(np.stack(s) for s in st_out) + tuple(np.stack(s) for s in sc_out)

    return kernel


@_reg("SequenceMap")
def sequence_map_factory(spec: KernelSpec):
    body = _builder(spec)(spec.attr("body"))
    n = len(spec.inputs)

    def kernel(*ins):
        seq, extra, caps = ins[0], ins[1:n], ins[n:]
        outs: list[list] = [[] for _ in range(body.n_outputs)]
        for i in range(len(seq)):
            check_deadline(spec.name)
            args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
            try:
                res = body.run(args, caps)
            except RunCancelledError as e:
                raise e.inside(spec.name, i) from None
            for k, r in enumerate(res):
                outs[k].append(r)
        return tuple(outs)

    return kernel


# ------------------------------------------------------------------------------------------
# sequences and optionals
# ------------------------------------------------------------------------------------------
def _pos(p, n: int, allow_end: bool) -> int:
    i = int(np.asarray(p).reshape(-1)[0])
    if i < 0:
        i += n
    hi = n if allow_end else n - 1
    if not 0 <= i <= hi:
        raise IndexError(f"position {int(np.asarray(p).reshape(-1)[0])} out of range for a sequence of {n}")
    return i


@_reg("SequenceEmpty")
def sequence_empty_factory(spec: KernelSpec):
    return lambda: ([],)


@_reg("SequenceConstruct")
def sequence_construct_factory(spec: KernelSpec):
    return lambda *xs: (list(xs),)


@_reg("SequenceInsert")
def sequence_insert_factory(spec: KernelSpec):
    def kernel(seq, x, pos=None):
        out = list(seq)
        if pos is None:
            out.append(x)
        else:
            out.insert(_pos(pos, len(out), True), x)
        return (out,)

    return kernel


@_reg("SequenceAt")
def sequence_at_factory(spec: KernelSpec):
    return lambda seq, pos: (seq[_pos(pos, len(seq), False)],)


@_reg("SequenceErase")
def sequence_erase_factory(spec: KernelSpec):
    def kernel(seq, pos=None):
        out = list(seq)
        del out[-1 if pos is None else _pos(pos, len(out), False)]
        return (out,)

    return kernel


@_reg("SequenceLength")
def sequence_length_factory(spec: KernelSpec):
    return lambda seq: (np.array(len(seq), dtype=np.int64),)


@_reg("SplitToSequence")
def split_to_sequence_factory(spec: KernelSpec):
    axis0 = int(spec.attr("axis", 0))
    keepdims = int(spec.attr("keepdims", 1))

    def kernel(x, split=None):
        axis = norm_axis(axis0, x.ndim)
        n = x.shape[axis]
        if split is None:
            parts = np.split(x, n, axis=axis) if n else []
            if not keepdims:
                parts = [np.squeeze(p, axis=axis) for p in parts]
            return (parts,)
        s = np.asarray(split)
        if s.ndim == 0:
            size = int(s)
            cuts = list(range(size, n, size))
        else:
            cuts = list(np.cumsum(s.astype(np.int64))[:-1])
        return (np.split(x, cuts, axis=axis),)

    return kernel


@_reg("ConcatFromSequence")
def concat_from_sequence_factory(spec: KernelSpec):
    axis0 = int(spec.attr("axis"))
    new_axis = int(spec.attr("new_axis", 0))

    def kernel(seq):
        if new_axis:
            return (np.stack(seq, axis=norm_axis(axis0, np.ndim(seq[0]) + 1)),)
        return (np.concatenate(seq, axis=norm_axis(axis0, np.ndim(seq[0]))),)

    return kernel


@_reg("Optional")
def optional_factory(spec: KernelSpec):
    return lambda x=None: (x,)


@_reg("OptionalHasElement")
def optional_has_element_factory(spec: KernelSpec):
    return lambda x=None: (np.array(x is not None),)


@_reg("OptionalGetElement")
def optional_get_element_factory(spec: KernelSpec):
    def kernel(x):
        if x is None:
            raise ValueError("OptionalGetElement of an empty optional")
        return (x,)

    return kernel
