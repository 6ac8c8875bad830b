"""Kernels of the blocked-layout ops (domain ``ge.cpu``) the ``nchwc_layout`` pass makes.

An activation in the blocked layout is ``(N, C/16, H, W, 16)`` (:mod:`ge_native.nchwc`). The
convolution packs its constant weight once, when the kernel is built; each op runs the vector
kernels of :mod:`ge_native.nchwc` (AVX-512F or AVX2) into the planned output, or, where they do not
run (neither, an .om compiled elsewhere), the same math in NumPy on the NCHW form.
"""

from __future__ import annotations

import threading

import numpy as np

from ge_core.errors import UnsupportedOpError
from ge_core.kernel import KernelSpec, with_caps
from ge_native import isa, native, nchwc, parallel

DOMAIN = "ge.cpu"

#: the activation names an NchwcConv's ``activation`` attribute may hold ("" none)
ACTIVATIONS = ("", *nchwc.ACTIVATIONS)


def _refuse(spec: KernelSpec, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"{spec.describe()}: {why}")


def _ints(spec: KernelSpec, name: str, n: int, default: int) -> tuple[int, ...]:
    v = spec.attr(name)
    vals = tuple(int(a) for a in v) if v is not None else (default,) * n
    if len(vals) != n or any(a < (0 if name == "pads" else 1) for a in vals):
        raise _refuse(spec, f"attribute {name} must be {n} {'non-negative' if name == 'pads' else 'positive'} ints")
    return vals


def _geometry(spec: KernelSpec, kernel_shape=None):
    k = _ints(spec, "kernel_shape", 2, 1) if kernel_shape is None else kernel_shape
    return k, _ints(spec, "strides", 2, 1), _ints(spec, "dilations", 2, 1), _ints(spec, "pads", 4, 0)


def out_shape(spec: KernelSpec, x: np.ndarray) -> tuple[int, ...]:
    """A blocked op's output shape at run time: its planned one, the batch (a symbol where the
    model was compiled with a dynamic batch) the input array ``x``'s."""
    shape = spec.outputs[0].shape if spec.outputs else None
    if shape is None or not shape or not all(isinstance(d, int) for d in shape[1:]) or getattr(x, "ndim", 0) < 1:
        raise _refuse(spec, "needs an output shape static but for the batch")
    return (shape[0] if isinstance(shape[0], int) else int(x.shape[0]), *shape[1:])


def _out(spec: KernelSpec, out, x: np.ndarray):
    return out[0] if out is not None else np.empty(out_shape(spec, x), np.float32)


def _unblock(x5: np.ndarray, c: int) -> np.ndarray:
    n, cb, h, w, b = x5.shape
    return np.ascontiguousarray(x5.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :c])


def _block(x4: np.ndarray, out5: np.ndarray) -> np.ndarray:
    n, c, h, w = x4.shape
    cb = out5.shape[1]
    full = np.zeros((n, cb * nchwc.BLOCK, h, w), np.float32)
    full[:, :c] = x4
    out5[...] = full.reshape(n, cb, nchwc.BLOCK, h, w).transpose(0, 1, 3, 4, 2)
    return out5


def _windows(x4: np.ndarray, k, s, d, pads, out_hw, fill: float) -> np.ndarray:
    """``(N, C, OH, OW, KH, KW)`` windows of ``x4`` padded with ``fill`` (the NumPy form)."""
    pt, pl, pb, pr = pads
    oh, ow = out_hw
    need_h = (oh - 1) * s[0] + (k[0] - 1) * d[0] + 1
    need_w = (ow - 1) * s[1] + (k[1] - 1) * d[1] + 1
    n, c, h, w = x4.shape
    xp = np.full((n, c, max(need_h, pt + h), max(need_w, pl + w)), fill, x4.dtype)
    xp[:, :, pt:pt + h, pl:pl + w] = x4
    xp = xp[:, :, :need_h, :need_w]
    v = np.lib.stride_tricks.sliding_window_view(xp, ((k[0] - 1) * d[0] + 1, (k[1] - 1) * d[1] + 1), axis=(2, 3))
    return v[:, :, ::s[0], ::s[1], ::d[0], ::d[1]][:, :, :oh, :ow]


_NUMPY_ACTS = {
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "silu": lambda v: v / (1.0 + np.exp(-v)),
    "hardswish": lambda v: v * np.clip(v / 6.0 + 0.5, 0.0, 1.0),
}


def _numpy_act(v: np.ndarray, act: str) -> np.ndarray:
    if act in _NUMPY_ACTS:
        return _NUMPY_ACTS[act](v)
    from math import erf, sqrt

    if act == "gelu":
        return 0.5 * v * (1.0 + np.vectorize(erf)(v / sqrt(2.0)))
    return 0.5 * v * (1.0 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))  # gelu_tanh


def _weight_of(spec: KernelSpec):
    """``(w, w_t, packing, wpk_const, w_shape)`` of an NchwcConv's weight input: the constant
    (M, C, KH, KW) weight (None when packed or computed at run time), its type, the packing, the
    constant packed weight, and the (M, C, KH, KW) shape (raises naming the node)."""
    w = spec.const_inputs[1] if len(spec.const_inputs) > 1 else None
    w_t = spec.inputs[1] if len(spec.inputs) > 1 else None
    packing = spec.attr("weight_packing", "") or ""
    packing = packing.decode() if isinstance(packing, bytes) else str(packing)
    if packing not in PACKINGS:
        raise _refuse(spec, f"weight_packing must be one of {', '.join(p or '(none)' for p in PACKINGS)}")
    wpk_const = None
    if packing:  # the weight packed at compile time (the .om keeps that form): its shape an attribute
        w_shape = tuple(int(v) for v in (spec.attr("weight_shape") or ()))
        # (stored float16 by a precision mode: widened once, here; bf16: its own kernel's bits)
        wdt = {"bf16": np.uint16, "int8": np.int8, "int8dw": np.int8}.get(packing, np.float32)
        if w is not None and w.dtype == np.float16 and packing not in ("bf16", "int8", "int8dw"):
            w = w.astype(np.float32)
        if w is not None and (w.dtype != wdt or w.ndim != 1):
            raise _refuse(spec, f"weight_packing {packing} needs a 1-D {np.dtype(wdt).name} weight")
        if w is None and (w_t is None or w_t.shape is None or len(w_t.shape) != 1):
            raise _refuse(spec, f"weight_packing {packing} needs a 1-D weight")
        # (computed at run time: a Cast of the float16 form ATC's precision modes store)
        wpk_const, w = (np.ascontiguousarray(w) if w is not None else None), None
        if packing in ("bf16", "int8", "int8dw") and wpk_const is None:
            raise _refuse(spec, f"weight_packing {packing} needs its weight as a constant")
    else:
        w_shape = tuple(w.shape) if w is not None else (tuple(w_t.shape) if w_t is not None and w_t.shape else ())
    if len(w_shape) != 4 or not all(isinstance(d, int) and d > 0 for d in w_shape) or (w is not None and w.dtype != np.float32):
        raise _refuse(spec, "needs a float32 (M, C, KH, KW) weight of a static shape")
    return w, w_t, packing, wpk_const, w_shape


def _input_blocks(spec: KernelSpec, plain: bool, group: int, depthwise: bool, w_shape) -> int:
    """The input's blocks of 16 channels (0 for a plain NCHW input), checked against the weight."""
    m, cg = w_shape[:2]
    x_t = spec.inputs[0]
    if plain:  # an NCHW input (a stem)
        if group > 1 or x_t is None or x_t.shape is None or len(x_t.shape) != 4 or x_t.shape[1] != cg:
            raise _refuse(spec, f"plain_input needs an ungrouped NCHW input of the weight's {cg} channels")
        return 0
    if x_t is None or x_t.shape is None or len(x_t.shape) != 5 or x_t.shape[4] != nchwc.BLOCK:
        raise _refuse(spec, "needs a blocked (N, C/16, H, W, 16) input")
    cb = x_t.shape[1]
    want = nchwc.blocks(m) if depthwise else (cg * group // nchwc.BLOCK if group > 1 else None)
    if not isinstance(cb, int) or (want is not None and cb != want) or (want is None and cb < nchwc.blocks(cg)):
        raise _refuse(spec, f"input blocks {cb} do not hold the weight's channels {w_shape}")
    return cb


def _numpy_conv(x5, w, b, z, y, *, plain, cb, depthwise, group, geometry, clip, act):
    """The NumPy form of an NchwcConv (an .om run where the blocked kernels do not), into ``y``."""
    k, s, d, pads = geometry
    m, cg = w.shape[:2]
    if plain:
        x4 = np.asarray(x5, np.float32)
    else:
        x4 = _unblock(x5, cb * nchwc.BLOCK if not depthwise else m)
    if group == 1:
        x4 = x4[:, :cg]
    oh, ow = y.shape[2:4]
    win = _windows(x4, k, s, d, pads, (oh, ow), 0.0)
    if depthwise:
        r = np.einsum("nchwij,cij->nchw", win, w[:, 0], optimize=True)
    elif group > 1:
        mg = m // group
        r = np.concatenate([np.einsum("nchwij,mcij->nmhw", win[:, i * cg:(i + 1) * cg], w[i * mg:(i + 1) * mg],
                                      optimize=True) for i in range(group)], axis=1)
    else:
        r = np.einsum("nchwij,mcij->nmhw", win, w, optimize=True)
    if b is not None:
        r = r + b.reshape(1, m, 1, 1)
    if z is not None:
        r = r + _unblock(z, m)
    if clip is not None:
        r = np.clip(r, clip[0], clip[1])
    if act:
        r = _numpy_act(r, act)
    return _block(r.astype(np.float32), y)


def _int8_conv(spec: KernelSpec, packing: str, wpk, w_shape, cb: int, geometry, epilogue, depthwise: bool, group: int):
    """The kernel of a quantised model's int8 NchwcConv (:mod:`..int8`): ``int8`` ungrouped,
    ``int8dw`` depthwise on a blocked input."""
    from ..int8 import int8_conv_kernel, int8_dw_kernel

    b, has_b, clip, act = epilogue
    if packing == "int8dw":
        if not depthwise:
            raise _refuse(spec, "weight_packing int8dw is for a depthwise convolution on a blocked input")
        return int8_dw_kernel(spec, wpk, w_shape, geometry, b, has_b, clip, act)
    if group != 1:
        raise _refuse(spec, "weight_packing int8 is for an ungrouped convolution")
    return int8_conv_kernel(spec, wpk, w_shape, cb, geometry, b, has_b, clip, act)


def conv_factory(spec: KernelSpec):
    """NchwcConv(x5, W, [B], [Z], [S]): ``act(clip(conv(x5 * S, W) + B + Z))`` on blocked arrays
    (``S`` a per-channel input scale, (N or 1, C/16, 1, 1, 16))."""
    w, w_t, packing, wpk_const, w_shape = _weight_of(spec)
    b = spec.const_inputs[2] if len(spec.const_inputs) > 2 else None
    has_b = len(spec.inputs) > 2 and spec.inputs[2] is not None
    group = int(spec.attr("group", 1) or 1)
    m, cg = w_shape[:2]
    depthwise = group > 1 and cg == 1 and group == m
    if group > 1 and not depthwise and (m % (group * nchwc.BLOCK) or cg % nchwc.BLOCK):
        raise _refuse(spec, f"a grouped convolution needs whole blocks of {nchwc.BLOCK} channels a group "
                            f"(weight {w_shape}, group {group})")
    plain = bool(int(spec.attr("plain_input", 0) or 0))
    cb = _input_blocks(spec, plain, group, depthwise, w_shape)
    k, s, d, pads = _geometry(spec, tuple(w_shape[2:]))
    act = spec.attr("activation", "") or ""
    act = act.decode() if isinstance(act, bytes) else act
    if act not in ACTIVATIONS:
        raise _refuse(spec, f"activation must be one of {', '.join(a or '(none)' for a in ACTIVATIONS)}")
    lo, hi = spec.attr("clip_min"), spec.attr("clip_max")
    clip = None if lo is None and hi is None else (float(-np.inf if lo is None else lo), float(np.inf if hi is None else hi))
    y_t = spec.outputs[0] if spec.outputs else None
    if packing in ("int8", "int8dw"):
        return _int8_conv(spec, packing, wpk_const, w_shape, cb, (k, s, d, pads), (b, has_b, clip, act),
                          depthwise and not plain, group)
    if packing == "bf16":
        if group != 1:
            raise _refuse(spec, "weight_packing bf16 is for an ungrouped convolution")
        from .nchwc_reduced import bf16_conv_kernel

        def numpy_form(x5, w_, b_, z_, y_):
            return _numpy_conv(x5, w_, b_, z_, y_, plain=plain, cb=cb, depthwise=False, group=1,
                               geometry=(k, s, d, pads), clip=clip, act=act)

        return bf16_conv_kernel(spec, wpk_const, w_shape, cb, (k, s, d, pads), b, has_b, clip, act, numpy_form)
    if packing:
        wino = int(packing[-1]) if packing.startswith("winograd") else 0
        fits = {"plain": plain, "depthwise": depthwise and not plain, "blocked": not plain and not depthwise}.get(
            packing, not plain and not depthwise and tuple(k) == (3, 3) and tuple(s) == (1, 1) and tuple(d) == (1, 1))
        if not fits:
            raise _refuse(spec, f"weight_packing {packing} does not fit the convolution (weight {w_shape}, group "
                                f"{group}, kernel {tuple(k)}, strides {tuple(s)}{', plain input' if plain else ''})")
        size = wpk_const.size if wpk_const is not None else w_t.shape[0]
        if size != packed_size(packing, w_shape, cb, group):
            raise _refuse(spec, f"a {packing} weight of {size} floats, {packed_size(packing, w_shape, cb, group)} "
                                f"expected for weight {w_shape}")
    else:
        algorithm = str(spec.options.get("conv_algorithm", "auto") or "auto")
        wino = 0 if depthwise else winograd_tile(algorithm, w_shape, group, k, s, d, plain,
                                                 y_t.shape if y_t is not None else None)
    mode = "nchwc"
    if plain:
        pack, run = nchwc.pack_plain, nchwc.conv_plain
    elif wino:
        # Winograd F(wino x wino, 3x3): the weight transformed and packed once, here
        def pack(a):
            return nchwc.winograd_weights(a, wino, in_blocks=cb, groups=group)

        def run(x_, wpk_, y_, k_, s_, d_, pads_, *rest):
            return nchwc.winograd(x_, wpk_, y_, wino, pads_, *rest, groups=group)

        mode = f"nchwc winograd{wino}"
    elif depthwise:
        pack, run = nchwc.pack_depthwise, nchwc.depthwise
    elif group > 1:
        pack = lambda a: nchwc.pack_weights(a, groups=group)  # noqa: E731
        run = lambda *a: nchwc.conv(*a, groups=group)  # noqa: E731
    else:
        pack, run = (lambda a: nchwc.pack_weights(a, in_blocks=cb)), nchwc.conv
    # a constant weight is packed once, here (unless the pass packed it at compile time); one
    # computed at run time (a Cast of the float16 weight ATC's precision modes store) is packed at
    # each call
    const_pack = wpk_const if wpk_const is not None else (pack(w) if w is not None else None)
    const_bias = nchwc.pad_bias(b, m) if b is not None else None
    raw: list = []  # the unpacked constant weight, for the NumPy form (made when first needed)

    def weight(wpk_run=None):
        if w is not None:
            return w
        if wpk_run is not None:
            return unpack(packing, wpk_run, w_shape, cb, group)
        if not raw:
            raw.append(unpack(packing, wpk_const, w_shape, cb, group))
        return raw[0]

    def numpy_conv(x5, w, b, z, y):
        return _numpy_conv(x5, w, b, z, y, plain=plain, cb=cb, depthwise=depthwise, group=group, geometry=(k, s, d, pads),
                           clip=clip, act=act)

    # an input scale (input 4: an SE block's gate, (N or 1, CB, 1, 1, 16)) scales the weight's
    # input channels per image instead of the activation: a copy of the weight a call, here
    scaled = wino == 0 and not plain and len(spec.inputs) > 4 and spec.inputs[4] is not None
    taps = k[0] * k[1]
    mb = nchwc.blocks(m)
    local = threading.local()  # the scaled weight's buffer, kept per thread from run to run

    def scaled_buffer(wpk):
        ws = getattr(local, "ws", None)
        if ws is None or ws.shape != wpk.shape:
            ws = local.ws = native.aligned(np.empty_like(wpk))  # (on a cache line, as the packs)
        return ws

    def kernel(x, w_in=None, b_in=None, z=None, sc=None, out=None):
        y = _out(spec, out, x)
        if plain:
            x = np.ascontiguousarray(x, np.float32)
        wpk_run = None  # a packed weight computed at run time (unpacked only for the NumPy form)
        if const_pack is not None:
            wpk = const_pack
            wv = None  # (weight(), for the NumPy form)
        elif packing:  # packed at compile time, cast at run time
            wpk = wpk_run = np.ascontiguousarray(w_in, np.float32).reshape(-1)
            if wpk.size != packed_size(packing, w_shape, cb, group):
                raise ValueError(f"{spec.describe()}: a {packing} weight of {wpk.size} floats at run time")
            wv = None
        else:
            wv = np.asarray(w_in, np.float32)
            if wv.shape != w_shape:
                raise ValueError(f"{spec.describe()}: weight of shape {wv.shape}, the kernel was built for {w_shape}")
            wpk = pack(wv)
        bv = b if b is not None else (None if not has_b or b_in is None else np.asarray(b_in, np.float32).reshape(-1))
        if bv is not None and bv.shape != (m,):
            raise ValueError(f"{spec.describe()}: a bias of shape {bv.shape} for {m} channels")
        bias = const_bias if const_bias is not None else nchwc.pad_bias(bv, m)
        width = parallel.native_width()
        if sc is not None and scaled:
            if sc.shape not in ((x.shape[0],) + x.shape[1:2] + (1, 1, nchwc.BLOCK), (1,) + x.shape[1:2] + (1, 1, nchwc.BLOCK)):
                raise ValueError(f"{spec.describe()}: an input scale of shape {sc.shape} for input {x.shape}")
            ws = scaled_buffer(wpk)
            for i in range(x.shape[0]):
                si = np.ascontiguousarray(sc[i if sc.shape[0] > 1 else 0], np.float32).reshape(-1)
                zi = None if z is None else z[i:i + 1]
                if not (nchwc.scale_weights(wpk, si, ws, x.shape[1], taps, mb, depthwise)
                        and run(x[i:i + 1], ws, y[i:i + 1], k, s, d, pads[:2], bias, clip, width, zi, act or None)):
                    numpy_conv(x[i:i + 1] * sc[i if sc.shape[0] > 1 else 0], weight(wpk_run) if wv is None else wv,
                               bv, zi, y[i:i + 1])
            return (y,)
        if sc is not None:
            x = x * sc
        if not run(x, wpk, y, k, s, d, pads[:2], bias, clip, width, z, act or None):
            numpy_conv(x, weight(wpk_run) if wv is None else wv, bv, z, y)
        return (y,)

    # (the report's node_kernels: "nchwc", or "nchwc_winograd2" / "nchwc_winograd4")
    return with_caps(kernel, accepts_out=True, mode=mode, algorithm=mode.replace(" ", "_"), variant=isa.variant_of("nchwc"))


#: Winograd F(2x2, 3x3) where a plane holds at least this many 2x2 tiles (7x7 planes of 512
#: channels ran 1.3x the direct kernel's speed, 14x14 to 56x56 ones 1.8-2x; a 4x4 plane of 1024
#: channels the same); F(4x4, 3x3) (option conv_algorithm=winograd4) where it holds this many
#: 4x4 tiles (a 20x20 plane: on fewer its transformed weight, 4x the direct one, is read from
#: memory for too little work)
WINOGRAD2_TILES = 9
WINOGRAD4_TILES = 25


def winograd_tile(algorithm: str, w_shape, group: int, k, s, d, plain: bool, y_shape) -> int:
    """The output tile m of the Winograd F(m x m, 3 x 3) an NchwcConv runs (2 or 4), 0 for the
    direct kernel, for a 3x3, stride-1, undilated convolution (grouped: whole blocks a group, as
    RegNet's and ResNeXt's; not a depthwise one): by the ``conv_algorithm`` option
    ``algorithm``, ``auto`` F(2x2) where the plane has the tiles above (its rounding is the
    direct sum's: transforms of 0, +-1 and +-1/2), ``winograd`` F(2x2) wherever it applies,
    ``winograd4`` F(4x4) where it pays, else F(2x2) (4x fewer multiplies than the direct sum at
    2-3x its rounding error: ResNet-50's output 2e-4 of its scale from float64, 9e-5 with
    F(2x2)), ``im2col`` never."""
    if algorithm == "im2col" or plain or tuple(k) != (3, 3) or tuple(s) != (1, 1) or tuple(d) != (1, 1):
        return 0
    if not nchwc.available() or (group > 1 and (w_shape[0] % (group * nchwc.BLOCK) or w_shape[1] % nchwc.BLOCK)):
        return 0
    if y_shape is None or len(y_shape) != 5 or not all(isinstance(v, int) for v in y_shape[2:4]):
        return 0
    oh, ow = y_shape[2:4]
    t4, t2 = -(-oh // 4) * -(-ow // 4), -(-oh // 2) * -(-ow // 2)
    if algorithm == "winograd":
        return 2
    if algorithm == "winograd4" and t4 >= WINOGRAD4_TILES:
        return 4
    return 2 if t2 >= WINOGRAD2_TILES else 0


#: how an NchwcConv's weight input is stored (attribute ``weight_packing``): "" the (M, C, KH, KW)
#: weight (packed when the kernel is built), else the layout pass's packing of it, done at compile
#: time and kept in the .om so a load does no weight work: "blocked" (:func:`ge_native.nchwc.
#: pack_weights`, grouped or not), "plain" (a stem's, ``pack_plain``), "depthwise", "winograd2" and
#: "winograd4" (``winograd_weights``: the algorithm chosen with the packing); a reduced precision's
#: "bf16" (:class:`ge_native.bf16.PackedConv`) and a quantised model's "int8"
#: (:class:`ge_native.int8.PackedConv8`) and "int8dw" (:class:`ge_native.int8dw.PackedDW8`)
PACKINGS = ("", "blocked", "plain", "depthwise", "winograd2", "winograd4", "bf16", "int8", "int8dw")


def packing_for(algorithm: str, w_shape, group: int, k, s, d, plain: bool, in_blocks: int, y_shape) -> str:
    """The packing (and so the algorithm) an NchwcConv of weight ``w_shape`` gets (:data:`PACKINGS`)."""
    m, cg = w_shape[:2]
    if plain:
        return "plain"
    if group > 1 and cg == 1 and group == m:
        return "depthwise"
    wino = winograd_tile(algorithm, w_shape, group, k, s, d, plain, y_shape)
    return f"winograd{wino}" if wino else "blocked"


def pack_weight(packing: str, w: np.ndarray, in_blocks: int, group: int) -> np.ndarray:
    """``w`` (M, C, KH, KW) packed as ``packing`` says, for an input of ``in_blocks`` blocks."""
    if packing == "plain":
        return nchwc.pack_plain(w)
    if packing == "depthwise":
        return nchwc.pack_depthwise(w)
    if packing.startswith("winograd"):
        return nchwc.winograd_weights(w, int(packing[-1]), in_blocks=in_blocks if group == 1 else None, groups=group)
    return nchwc.pack_weights(w, groups=group) if group > 1 else nchwc.pack_weights(w, in_blocks=in_blocks)


def packed_size(packing: str, w_shape, in_blocks: int, group: int) -> int:
    """The floats of ``packing``'s form of a weight of ``w_shape`` (bf16: its uint16 values)."""
    m, cg, kh, kw = w_shape
    if packing == "bf16":
        from .nchwc_reduced import stored_size

        return stored_size(w_shape, in_blocks)
    if packing == "int8":
        from ..int8 import conv_packed_shape

        return int(np.prod(conv_packed_shape(w_shape, in_blocks)))
    if packing == "int8dw":
        from ..int8 import dw_packed_shape

        return int(np.prod(dw_packed_shape(w_shape)))
    mb = nchwc.blocks(m)
    if packing == "plain":
        return mb * nchwc.BLOCK * cg * kh * kw
    if packing == "depthwise":
        return mb * nchwc.BLOCK * kh * kw
    cb = nchwc.blocks(cg) if group > 1 else max(nchwc.blocks(cg), in_blocks)
    if packing.startswith("winograd"):
        return (int(packing[-1]) + 2) ** 2 * mb * nchwc.BLOCK * cb * nchwc.BLOCK
    return mb * nchwc.BLOCK * cb * nchwc.BLOCK * kh * kw


def unpack(packing: str, wpk: np.ndarray, w_shape, in_blocks: int, group: int) -> np.ndarray:
    """The (M, C, KH, KW) weight of a packed one (the NumPy form's: an .om run where the blocked
    kernels do not); Winograd's from U = G g G^T by G's pseudo-inverse (exact in float64, the
    float32 rounding of U left)."""
    B = nchwc.BLOCK
    m, cg, kh, kw = w_shape
    mb = nchwc.blocks(m)
    if packing == "depthwise":
        full = wpk.reshape(mb, kh, kw, B).transpose(0, 3, 1, 2).reshape(mb * B, 1, kh, kw)
        return np.ascontiguousarray(full[:m])
    if packing.startswith("winograd"):
        r = int(packing[-1]) + 2
        g = nchwc.WINOGRAD_G[int(packing[-1])]
        gi = np.linalg.pinv(g)  # (3, r)
        u = np.stack([unpack("blocked", part, (m, cg, 1, 1), in_blocks, group) for part in np.split(wpk, r * r)])
        u = u.reshape(r, r, m, cg).astype(np.float64)
        return np.einsum("ia,abmc,jb->mcij", gi, u, gi).astype(np.float32)
    if group > 1 and packing == "blocked":
        step = m // group
        parts = np.split(wpk, group)
        return np.concatenate([unpack("blocked", part, (step, cg, kh, kw), nchwc.blocks(cg), 1) for part in parts])
    plain = packing == "plain"
    cb = cg if plain else max(nchwc.blocks(cg), in_blocks)
    cin = cg if plain else cb * B
    out = np.zeros((mb * B, cin, kh, kw), np.float32)
    off = 0
    for g0 in range(0, mb, 4):
        fb = min(4, mb - g0)
        if plain:  # (c, kh, kw, f, out)
            n = cg * kh * kw * fb * B
            blk = wpk[off:off + n].reshape(cg, kh, kw, fb, B).transpose(3, 4, 0, 1, 2)
            out[g0 * B:(g0 + fb) * B] = blk.reshape(fb * B, cg, kh, kw)
        else:  # (cb, kh, kw, in, f, out)
            n = cb * kh * kw * B * fb * B
            blk = wpk[off:off + n].reshape(cb, kh, kw, B, fb, B).transpose(4, 5, 0, 3, 1, 2)
            out[g0 * B:(g0 + fb) * B] = blk.reshape(fb * B, cb * B, kh, kw)
        off += n
    return np.ascontiguousarray(out[:m, :cg])


def reorder_input_factory(spec: KernelSpec):
    """NchwcReorderInput(x): NCHW to blocked (the channels past C zeros)."""

    def kernel(x, out=None):
        y = _out(spec, out, x)
        x = np.ascontiguousarray(x, np.float32)
        if not nchwc.to_blocked(x, y, parallel.native_width()):
            _block(x, y)
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc")


def reorder_output_factory(spec: KernelSpec):
    """NchwcReorderOutput(x5, channels=C): blocked to NCHW."""

    def kernel(x, out=None):
        y = _out(spec, out, x)
        if not nchwc.from_blocked(x, y, parallel.native_width()):
            y[...] = _unblock(x, y.shape[1])
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc")


def _pool_factory(kind_of):
    def factory(spec: KernelSpec):
        k, s, d, pads = _geometry(spec)
        kind = kind_of(spec)

        def numpy_pool(x5, y):
            c = x5.shape[1] * nchwc.BLOCK
            x4 = _unblock(x5, c)
            win = _windows(x4, k, s, d, pads, y.shape[2:4], -np.inf if kind == "max" else np.nan)
            if kind == "max":
                r = win.max(axis=(4, 5))
            elif kind == "avg_pad":
                r = np.nan_to_num(win, nan=0.0).sum(axis=(4, 5)) / (k[0] * k[1])
            else:
                r = np.nanmean(win, axis=(4, 5))
            _block(r.astype(np.float32), y)

        def kernel(x, out=None):
            y = _out(spec, out, x)
            if not nchwc.pool(x, y, kind, k, s, d, pads[:2], parallel.native_width()):
                numpy_pool(x, y)
            return (y,)

        return with_caps(kernel, accepts_out=True, mode="nchwc")

    return factory


maxpool_factory = _pool_factory(lambda spec: "max")
avgpool_factory = _pool_factory(lambda spec: "avg_pad" if int(spec.attr("count_include_pad", 0) or 0) else "avg")


def global_avgpool_factory(spec: KernelSpec):
    """NchwcGlobalAveragePool(x5) -> (N, C, 1, 1) in NCHW."""

    def kernel(x, out=None):
        y = _out(spec, out, x)
        n, c = y.shape[:2]
        full = np.empty((n, x.shape[1] * nchwc.BLOCK), np.float32)
        if not nchwc.global_average(x, full, parallel.native_width()):
            full[...] = x.mean(axis=(2, 3), dtype=np.float64).reshape(n, -1)
        y[...] = full[:, :c].reshape(y.shape)
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc")


def groupnorm_factory(spec: KernelSpec):
    """NchwcGroupNorm(x5, scale5, bias5): group normalization of blocked values (then a Relu)."""
    gs = int(spec.attr("group_channels", 1) or 1)
    eps = float(spec.attr("epsilon", 1e-5))
    relu = int(spec.attr("relu", 0) or 0)
    if gs < 1 or not (nchwc.BLOCK % gs == 0 or gs % nchwc.BLOCK == 0):
        raise _refuse(spec, f"group_channels {gs} must divide {nchwc.BLOCK} or be whole blocks")

    def numpy_gn(x, sc, bi, y):
        n, cb, h, w, b = x.shape
        x4 = _unblock(x, cb * b).astype(np.float64).reshape(n, cb * b // gs, -1)
        mean = x4.mean(axis=-1, keepdims=True)
        norm = ((x4 - mean) / np.sqrt(x4.var(axis=-1, keepdims=True) + eps)).reshape(n, cb * b, h, w)
        r = norm * sc.reshape(1, -1, 1, 1) + bi.reshape(1, -1, 1, 1)
        _block((np.maximum(r, 0.0) if relu else r).astype(np.float32), y)

    def kernel(x, sc, bi, out=None):
        y = _out(spec, out, x)
        scv = np.ascontiguousarray(sc, np.float32).reshape(-1)
        biv = np.ascontiguousarray(bi, np.float32).reshape(-1)
        if x.ndim != 5 or scv.size != x.shape[1] * nchwc.BLOCK or biv.size != scv.size or (x.shape[1] * nchwc.BLOCK) % gs:
            raise ValueError(f"{spec.describe()}: input {x.shape}, scale {sc.shape}, bias {bi.shape} do not fit "
                             f"groups of {gs} channels")
        if not nchwc.group_norm(x, y, gs, scv, biv, eps, parallel.native_width(), relu=bool(relu)):
            numpy_gn(x, scv, biv, y)
        return (y,)

    return with_caps(kernel, accepts_out=True, mode="nchwc")


KERNELS = {
    (DOMAIN, "NchwcConv"): conv_factory,
    (DOMAIN, "NchwcGroupNorm"): groupnorm_factory,
    (DOMAIN, "NchwcReorderInput"): reorder_input_factory,
    (DOMAIN, "NchwcReorderOutput"): reorder_output_factory,
    (DOMAIN, "NchwcMaxPool"): maxpool_factory,
    (DOMAIN, "NchwcAveragePool"): avgpool_factory,
    (DOMAIN, "NchwcGlobalAveragePool"): global_avgpool_factory,
}
