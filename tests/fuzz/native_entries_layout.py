"""The native target's convolution and pooling entries outside GEMM: NCHWc, the window loops,
the direct depthwise kernel and Winograd's transforms."""

from __future__ import annotations

from typing import Any

import numpy as np
from fuzz_engine import OracleViolation
from native_inputs import (
    CLEAN,
    _raw_call,
    arr,
    close,
    conv_ref,
    dim,
    hostile_array,
    refused,
    through_wrapper,
    weird_int,
)


def e_nchwc(rng, hostile):
    from ge_native import nchwc

    if not nchwc.available():
        raise refused("nchwc", "not built here")
    kind = rng.choice(["conv", "conv", "dw", "pool", "gap", "reorder", "wino", "plain", "gn", "scale"])
    n = rng.choice([0, 1, 1, 2])
    cb, mb = rng.choice([0, 1, 1, 2]), rng.choice([0, 1, 1, 2])
    h, wd = dim(rng, 12), dim(rng, 12)
    k = (rng.choice([1, 3, 3, 5]), rng.choice([1, 3, 3]))
    s = (rng.choice([1, 1, 2]), rng.choice([1, 1, 2]))
    d = (1, 1) if rng.random() < 0.7 else (2, 2)
    p = (rng.choice([0, 1]), rng.choice([0, 1]))
    oh = max(0, (h + 2 * p[0] - (k[0] - 1) * d[0] - 1) // s[0] + 1)
    ow = max(0, (wd + 2 * p[1] - (k[1] - 1) * d[1] - 1) // s[1] + 1)
    x5 = arr(rng, (n, cb, h, wd, 16))
    width = rng.choice([1, 2])
    what = ""
    hb = hostile
    args: dict[str, Any] = {}
    try:
        if kind == "conv":
            w = arr(rng, (mb * 16, cb * 16, *k), guard=0)
            wpk = nchwc.pack_weights(w)
            out = np.full((n, mb, oh, ow, 16), np.nan, np.float32)  # (an output left unwritten shows)
            args = {"x": x5, "out": out}
            if hb:
                key = rng.choice(list(args))
                args[key], what = hostile_array(rng, args[key])
            ok = nchwc.conv(args["x"], wpk, args["out"], k, s, d, p, None, None, width)
            if ok and not what and n and mb and oh and ow:
                x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                if not (nchwc.from_blocked(x5, x4) if cb else True):
                    raise OracleViolation("from_blocked refused a valid array")
                y4 = np.zeros((n, mb * 16, oh, ow), np.float32)
                nchwc.from_blocked(out, y4)
                for i in range(n):
                    close("nc_conv", y4[i], conv_ref(x4[i], w, 1, k, s, d, p, (oh, ow)))
        elif kind == "dw":
            w = arr(rng, (cb * 16, 1, *k), guard=0)
            wpk = nchwc.pack_depthwise(w)
            out = np.full((n, cb, oh, ow, 16), np.nan, np.float32)
            args = {"x": x5, "out": out}
            if hb:
                key = rng.choice(list(args))
                args[key], what = hostile_array(rng, args[key])
            ok = nchwc.depthwise(args["x"], wpk, args["out"], k, s, d, p, None, None, width)
            if ok and not what and n and cb and oh and ow:
                x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                nchwc.from_blocked(x5, x4)
                y4 = np.zeros((n, cb * 16, oh, ow), np.float32)
                nchwc.from_blocked(out, y4)
                for i in range(n):
                    close("nc_dwconv", y4[i], conv_ref(x4[i], w, cb * 16, k, s, d, p, (oh, ow)))
        elif kind == "pool":
            out = np.zeros((n, cb, oh, ow, 16), np.float32)
            pk = rng.choice(list(nchwc.POOLS) + (["bad"] if hb else []))
            geo = [k, s, d, p]
            if hb and rng.random() < 0.5:
                geo[rng.randrange(4)] = (weird_int(rng), 1)
                what = "geometry"
            ok = nchwc.pool(x5, out, pk, *geo, width)
        elif kind == "gap":
            out = np.zeros((n, cb * 16), np.float32)
            if hb:
                out, what = hostile_array(rng, out)
            ok = nchwc.global_average(x5, out, width)
            if ok and not what and h * wd:
                x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                nchwc.from_blocked(x5, x4)
                close("nc_gap", out, x4.astype(np.float64).mean(axis=(2, 3)))
        elif kind == "reorder":
            c = rng.choice([0, 1, 3, 16, 17, 33])
            x4 = arr(rng, (n, c, h, wd))
            y5 = np.zeros(nchwc.blocked_shape(x4.shape), np.float32)
            if hb:
                y5, what = hostile_array(rng, y5)
            ok = nchwc.to_blocked(x4, y5, width)
            if ok and not what:
                back = np.zeros_like(x4)
                if not nchwc.from_blocked(y5, back, width):
                    raise OracleViolation("from_blocked refused what to_blocked wrote")
                close("nc_reorder", back, x4.astype(np.float64), 0)
        elif kind == "wino":
            m = rng.choice([2, 4])
            w = arr(rng, (mb * 16, cb * 16, 3, 3), guard=0)
            if not mb or not cb:
                ok = False
                what = "no channels"
            else:
                upk = nchwc.winograd_weights(w, m)
                oh3, ow3 = max(0, h + 2 * p[0] - 2), max(0, wd + 2 * p[1] - 2)
                out = np.full((n, mb, oh3, ow3, 16), np.nan, np.float32)
                if hb:
                    out, what = hostile_array(rng, out)
                ok = nchwc.winograd(x5, upk, out, m, p, None, None, width)
                if ok and not what and n and oh3 and ow3:
                    x4 = np.zeros((n, cb * 16, h, wd), np.float32)
                    nchwc.from_blocked(x5, x4)
                    y4 = np.zeros((n, mb * 16, oh3, ow3), np.float32)
                    nchwc.from_blocked(out, y4)
                    for i in range(n):
                        close("nc_wino", y4[i], conv_ref(x4[i], w, 1, (3, 3), (1, 1), (1, 1), p, (oh3, ow3)), 2e-3)
        elif kind == "plain":
            c = rng.choice([0, 1, 3])
            x4 = arr(rng, (n, c, h, wd))
            w = arr(rng, (mb * 16, c, *k), guard=0)
            out = np.full((n, mb, oh, ow, 16), np.nan, np.float32)
            if hb:
                out, what = hostile_array(rng, out)
            ok = nchwc.conv_plain(x4, nchwc.pack_plain(w), out, k, s, d, p, None, None, width)
            if ok and not what and n and mb and oh and ow:
                y4 = np.zeros((n, mb * 16, oh, ow), np.float32)
                nchwc.from_blocked(out, y4)
                for i in range(n):
                    close("nc_conv_plain", y4[i], conv_ref(x4[i], w, 1, k, s, d, p, (oh, ow)))
        elif kind == "gn":
            gs = rng.choice([1, 2, 4, 8, 16, 32, 3, 0])
            out = np.zeros_like(x5)
            eps = rng.choice([1e-5, 0.0, float("nan"), -1.0]) if hb else 1e-5
            what = "eps" if hb else ""
            ok = nchwc.group_norm(x5, out, gs, np.ones(cb * 16, np.float32), np.zeros(cb * 16, np.float32), eps,
                                  width, rng.random() < 0.5)
        else:
            taps = k[0] * k[1]
            wpk = np.asarray(nchwc.pack_weights(arr(rng, (mb * 16, cb * 16, *k), guard=0)))
            sc = arr(rng, (cb * 16,))
            out = np.zeros_like(wpk)
            ib, ob = (cb, mb) if not hb else (rng.choice([cb, weird_int(rng)]), rng.choice([mb, weird_int(rng)]))
            what = "blocks" if hb else ""
            ok = nchwc.scale_weights(wpk, sc, out, ib, taps, ob)
    except CLEAN as e:
        raise refused("nc_" + kind, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("nc_" + kind, f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not ok:
        raise refused("nc_" + kind, f"wrapper refused ({what or 'valid'})")
    return "nc_" + kind


def e_window(rng, hostile):
    from ge_cpu.kernels import _window

    if not _window.available():
        raise refused("window", "not built here")
    kind = rng.choice(["conv", "max", "avg"])
    dt = np.dtype(rng.choice(["float32", "float64"]))
    n, c = rng.choice([0, 1, 2]), dim(rng, 6)
    h, wd = dim(rng, 14), dim(rng, 14)
    k = (rng.choice([1, 2, 3]), rng.choice([1, 2, 3]))
    s = (rng.choice([1, 2]), rng.choice([1, 2]))
    d = (rng.choice([1, 1, 2]), 1)
    pb = (rng.choice([0, 1]), rng.choice([0, 1]))
    oh = (h + 2 * pb[0] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (wd + 2 * pb[1] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    if oh < 1 or ow < 1:
        oh, ow = max(oh, 0), max(ow, 0)
    try:
        plan = _window.WindowPlan((h, wd), k, s, d, pb, (oh, ow))
    except CLEAN as e:
        raise refused("window", e) from None
    x = arr(rng, (n, c, h, wd), dt)
    out = np.full((n, c, oh, ow), np.nan, dt)
    wt = arr(rng, (c, k[0] * k[1]), dt) if kind == "conv" else None
    bias = arr(rng, (c,), dt) if kind == "conv" else None
    dv = np.full(oh * ow, float(k[0] * k[1]), dt) if kind == "avg" else None
    what = ""
    if hostile:
        r = rng.randrange(3)
        if r == 0:
            x, what = hostile_array(rng, x)
        elif r == 1:
            out, what = hostile_array(rng, out)
        elif kind == "conv":
            wt, what = hostile_array(rng, wt)
        else:
            dv, what = hostile_array(rng, np.ones(oh * ow, dt))
    ok = through_wrapper("window_" + kind, what, lambda: _window.run(kind, plan, x, out, wt, bias, dv, threads=rng.choice([1, 2]), direct=rng.random() < 0.5))
    if not ok:
        raise refused("window_" + kind, f"wrapper refused ({what or 'valid'})")
    if not what and kind == "conv" and n and c and oh and ow:
        for i in range(n):
            want = conv_ref(x[i], wt.reshape(c, 1, *k), c, k, s, d, pb, (oh, ow)) + np.asarray(bias, np.float64)[:, None, None]
            close("window_conv", out[i], want, 1e-3)
    return "window_" + kind


def e_dw_direct(rng, hostile):
    from ge_cpu.kernels import _window

    mod = _window._direct()
    if mod is None:
        raise refused("dw_conv", "not built here")
    n, c, h, w = rng.choice([0, 1, 2]), dim(rng, 20), dim(rng, 16), dim(rng, 16)
    kh, kw, sh, sw = rng.choice([1, 3, 5]), rng.choice([1, 3, 5]), rng.choice([1, 2]), rng.choice([1, 2])
    pt, pl, dh, dw, mult = rng.choice([0, 1, 2]), rng.choice([0, 1, 2]), 1, 1, rng.choice([1, 1, 2])
    oh = max(0, (h + 2 * pt - kh) // sh + 1)
    ow = max(0, (w + 2 * pl - kw) // sw + 1)
    x = arr(rng, (n, c, h, w))
    wt = arr(rng, (c * mult, kh * kw))
    b = arr(rng, (c * mult,))
    out = np.zeros((n, c * mult, oh, ow), np.float32)
    args = [n, c, h, w, oh, ow, kh, kw, sh, sw, pt, pl, dh, dw, mult, x, wt, b, out, rng.choice([1, 2]),
            rng.randrange(6), float("-inf"), float("inf")]
    label = _raw_call("dw_conv", mod.dw_conv, args, rng, hostile)
    if not hostile and n and c and oh and ow and mult == 1 and args[20] == 0:
        for i in range(n):
            want = conv_ref(x[i], wt.reshape(c, 1, kh, kw), c, (kh, kw), (sh, sw), (1, 1), (pt, pl), (oh, ow))
            close("dw_conv", out[i], want + np.asarray(b, np.float64)[:, None, None], 1e-3)
    return label


def e_winograd(rng, hostile):
    from ge_cpu.kernels import winograd

    dt = rng.choice([np.float32, np.float64])
    if rng.random() < 0.5:  # the layer
        n, c, m = rng.choice([0, 1, 2]), dim(rng, 8), dim(rng, 8)
        h, wd = dim(rng, 12), dim(rng, 12)
        pads = tuple(rng.choice([0, 1]) for _ in range(4))
        w = arr(rng, (m, c, 3, 3), dt, guard=0)
        if not c or not m:
            raise refused("winograd", "no channels")
        wino = winograd.Winograd(w)
        x = arr(rng, (n, c, h, wd), dt)
        bias = arr(rng, (m,), dt) if rng.random() < 0.5 else None
        if hostile:
            x = hostile_array(rng, x)[0]
        try:
            y = wino.run(x, pads, None, bias)
        except CLEAN as e:
            raise refused("winograd", e) from None
        except (AttributeError, IndexError) as e:
            if hostile:
                raise refused("winograd", f"wrapper: {type(e).__name__}: {e}") from None
            raise
        if not hostile:
            oh, ow = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
            want = np.stack([conv_ref(x[i], w, 1, (3, 3), (1, 1), (1, 1), pads[:2], (oh, ow)) for i in range(n)]) \
                if n else np.zeros((0, m, oh, ow))
            if bias is not None:
                want = want + np.asarray(bias, np.float64)[:, None, None]
            close("winograd", y, want, 2e-3)
        return "winograd"
    fns = winograd.native_transforms(dt)
    if fns is None:
        raise refused("winograd", "not built here")
    fin, fout = fns
    n, c, h, w = rng.choice([0, 1, 2]), dim(rng, 6), dim(rng, 10), dim(rng, 10)
    th, tw = (h + 1) // 2, (w + 1) // 2
    if rng.random() < 0.5:
        args = [arr(rng, (n, c, h, w), dt), np.zeros((16, c, n * th * tw), dt), n, c, h, w, 1, 1, th, tw,
                rng.choice([1, 2])]
        return _raw_call("wino_in", fin, args, rng, hostile)
    m = dim(rng, 6)
    oh, ow = 2 * th, 2 * tw
    args = [arr(rng, (16, m, n * th * tw), dt), np.zeros((n, m, oh, ow), dt), None, n, m, oh, ow, rng.choice([1, 2])]
    return _raw_call("wino_out", fout, args, rng, hostile)
