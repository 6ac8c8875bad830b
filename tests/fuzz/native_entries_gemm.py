"""The native target's GEMM entries: sgemm (packed, rows, convolution, raw), gemm blocks and
the attention heads."""

from __future__ import annotations

import numpy as np
from native_inputs import (
    CLEAN,
    _conv_geometry,
    _epilogue,
    _raw_call,
    act_ref,
    arr,
    close,
    conv_ref,
    dim,
    hostile_array,
    refused,
    through_wrapper,
    weird_int,
)


def e_sgemm_packed(rng, hostile):
    from ge_native import sgemm

    m, k, n = dim(rng, 100), dim(rng, 70), dim(rng, 80)
    a = arr(rng, (m, k))
    w = arr(rng, (k, n), guard=0)
    panels = sgemm.Panels(w)
    out = np.full((m, n), np.nan, np.float32)
    bias = arr(rng, (n,)) if rng.random() < 0.5 else None
    clip, act = _epilogue(rng)
    z = arr(rng, (m, n)) if rng.random() < 0.3 else None
    width = rng.choice([1, 1, 2, 3])
    what = ""
    if hostile:
        which = rng.randrange(5)
        if which == 0:
            a, what = hostile_array(rng, a)
        elif which == 1:
            out, what = hostile_array(rng, out)
        elif which == 2 and bias is not None:
            bias, what = hostile_array(rng, bias)
        elif which == 3:
            width, what = weird_int(rng), "width"
        else:
            z, what = (out if rng.random() < 0.5 else hostile_array(rng, arr(rng, (m, n)))[0]), "addend"
    ok = through_wrapper("sg_packed", what, lambda: sgemm.matmul_packed(a, panels, out, bias, clip, width, z, act))
    if not ok:
        raise refused("sg_packed", f"wrapper refused ({what or 'valid arguments'})")
    if not what:
        want = np.asarray(a, np.float64) @ np.asarray(w, np.float64)
        if bias is not None:
            want = want + bias
        if z is not None:
            want = want + z
        if not (clip is not None and np.isnan(clip[0])):
            close("sg_packed", out, act_ref(want, act, clip))
    return "sg_packed"


def e_sgemm_rows(rng, hostile):
    from ge_native import sgemm

    m, k, n = dim(rng, 60), dim(rng, 50), dim(rng, 90)
    w = arr(rng, (m, k))
    a = sgemm.RowPanels(w) if rng.random() < 0.5 else w
    b = arr(rng, (k, n))
    out = np.full((m, n), np.nan, np.float32)
    bias = arr(rng, (m,)) if rng.random() < 0.5 else None
    what = ""
    if hostile:
        which = rng.randrange(3)
        if which == 0:
            b, what = hostile_array(rng, b)
        elif which == 1:
            out, what = hostile_array(rng, out)
        else:
            bias, what = hostile_array(rng, arr(rng, (m,)))
    ok = through_wrapper("sg_conv", what, lambda: sgemm.matmul_rows(a, b, out, bias, None, rng.choice([1, 2])))
    if not ok:
        raise refused("sg_conv", f"wrapper refused ({what or 'valid'})")
    if not what:
        want = np.asarray(w, np.float64) @ np.asarray(b, np.float64)
        if bias is not None:
            want = want + np.asarray(bias, np.float64)[:, None]
        close("sg_conv/rows", out, want)
    return "sg_conv:rows"


def e_sgemm_conv(rng, hostile):
    from ge_native import sgemm

    group, c, m, k, s, d, p, (h, wd), (oh, ow) = _conv_geometry(rng)
    x = arr(rng, (c, h, wd))
    w = arr(rng, (m, c // group if group else 0, *k), guard=0)
    w2 = w.reshape(m, -1) if m else np.zeros((0, (c // group) * k[0] * k[1]), np.float32)
    rows = sgemm.RowPanels(np.ascontiguousarray(w2), group) if rng.random() < 0.5 else np.ascontiguousarray(w2)
    out = np.full((m, oh * ow), np.nan, np.float32)
    bias = arr(rng, (m,)) if rng.random() < 0.5 else None
    clip, act = _epilogue(rng)
    geo = [group, k, s, d, p, (oh, ow)]
    what = ""
    if hostile:
        which = rng.randrange(4)
        if which == 0:
            x, what = hostile_array(rng, x)
        elif which == 1:
            out, what = hostile_array(rng, out)
        elif which == 2:
            i = rng.randrange(6)
            geo[i] = weird_int(rng) if i == 0 else (weird_int(rng), rng.choice([1, weird_int(rng)]))
            what = f"geometry {i}"
        else:
            bias, what = hostile_array(rng, arr(rng, (m,)))
    prepared = rng.random() < 0.3 and isinstance(rows, sgemm.RowPanels) and not what
    try:
        if prepared:
            ok = sgemm.Conv2d(rows, *geo, bias).run(x, out, clip, rng.choice([1, 2]), None, act)
        else:
            ok = sgemm.conv2d(x, rows, out, *geo, bias, clip, rng.choice([1, 2]), None, act)
    except CLEAN as e:
        raise refused("sg_conv", e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("sg_conv", f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not ok:
        raise refused("sg_conv", f"wrapper refused ({what or 'valid'})")
    if not what:
        want = conv_ref(x, w, group, k, s, d, p, (oh, ow)).reshape(m, oh * ow)
        if bias is not None:
            want = want + np.asarray(bias, np.float64)[:, None]
        if not (clip is not None and np.isnan(clip[0])):
            close("sg_conv", out, act_ref(want, act, clip))
    return "sg_conv:prepared" if prepared else "sg_conv"


def e_sgemm_raw(rng, hostile):
    from ge_native import sgemm

    mod = sgemm._mod()
    if mod is None:
        raise refused("sgemm", "not built here")
    if rng.random() < 0.5:
        m, k, n = dim(rng), dim(rng), dim(rng)
        p = sgemm.Panels(arr(rng, (k, n), guard=0))
        args = [arr(rng, (m, k)), p.data, np.zeros((m, n), np.float32), np.zeros(max(n, 1), np.float32),
                rng.choice([0, 1]), rng.choice([0, 1]), 0.0, 6.0, rng.choice([1, 2]), None, rng.randrange(6)]
        return _raw_call("sg_packed", mod.sg_packed, args, rng, True if hostile else False)
    group, c, m, k, s, d, p, (h, wd), (oh, ow) = _conv_geometry(rng)
    geo = np.array([group, *k, *s, *d, *p, oh, ow], np.int64)
    w2 = arr(rng, (m, (c // group) * k[0] * k[1]), guard=0)
    if hostile and rng.random() < 0.15:  # channels x kernel sides that wrap int64 to 0 (a weight of no columns)
        x = arr(rng, (16 * group, 3, 3))
        geo[1] = geo[2] = 2**30
        w2 = np.zeros((m, 0), np.float32)
        args = [x, w2, np.zeros((m, oh * ow), np.float32), np.zeros(max(m, 1), np.float32), 0, 0, 0.0, 0.0, 1, None,
                0, geo, -1]
        return _raw_call("sg_conv", mod.sg_conv, args, rng, False)
    if hostile and rng.random() < 0.5:
        geo[rng.randrange(11)] = rng.choice([0, -1, 2**31, 2**40, 2**62])
        hostile = False
    args = [arr(rng, (c, h, wd)), w2, np.zeros((m, oh * ow), np.float32), np.zeros(max(m, 1), np.float32),
            rng.choice([0, 2]), 0, 0.0, 0.0, rng.choice([1, 2]), None, 0, geo, -1]
    return _raw_call("sg_conv", mod.sg_conv, args, rng, hostile)


def e_gemm(rng, hostile):
    from ge_native import gemm

    if not gemm.available():
        raise refused("gemm", "not built here")
    kind = rng.choice(["rows", "cols", "batch", "blocks"])
    dt = rng.choice([np.float32, np.float64])
    m, k, n = rng.choice([0, 8, 9, 17, 33]), dim(rng), dim(rng)
    a = arr(rng, (m, k), dt)
    b = arr(rng, (k, n), dt)
    out = np.full((m, n), np.nan, dt)
    what = ""
    try:
        if kind in ("rows", "cols"):
            cut = rng.randint(0, m if kind == "rows" else n)
            end = m if kind == "rows" else n
            cuts = [(0, cut), (cut, end)] if 0 < cut < end else [(0, end)]
            if hostile:
                r = rng.randrange(3)
                if r == 0:
                    cuts, what = [(0, end + rng.choice([1, 2**40])), (end, end)], "cuts"
                elif r == 1:
                    out, what = hostile_array(rng, out)
                else:
                    a, what = hostile_array(rng, a)
            if kind == "rows":
                ok = gemm.run_rows(a, b, out, cuts, rng.choice([1, 2]))
            else:
                ok = gemm.run_cols(a, b, out, cuts, rng.choice([1, 2]))
            want = np.asarray(a, np.float64) @ np.asarray(b, np.float64) if not what else None
        elif kind == "batch":
            bt = rng.choice([0, 1, 3])
            a3, b3 = arr(rng, (bt, m, k), dt), arr(rng, (bt, k, n), dt)
            o3 = np.full((bt, m, n), np.nan, dt)
            if hostile:
                o3, what = hostile_array(rng, o3)
            ok = gemm.run_batched(a3, b3, o3, rng.choice([1, 2]))
            out = o3
            want = np.matmul(a3.astype(np.float64), b3.astype(np.float64)) if not what else None
        else:
            cut = rng.randint(0, n)
            parts = [np.ascontiguousarray(b[:, :cut]), np.ascontiguousarray(b[:, cut:])]
            prep = gemm.Blocks(parts, [0, cut])
            bias = arr(rng, (n,), dt) if rng.random() < 0.5 else None
            if hostile:
                out, what = hostile_array(rng, out)
            ok = gemm.run_blocks(prep, a, out, bias, rng.choice([1, 2]))
            want = None
            if not what:
                want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
                if bias is not None:
                    want = want + bias
    except CLEAN as e:
        raise refused("gemm_" + kind, e) from None
    except (AttributeError, IndexError) as e:
        if what:
            raise refused("gemm_" + kind, f"wrapper: {type(e).__name__}: {e}") from None
        raise
    if not ok:
        raise refused("gemm_" + kind, f"wrapper refused ({what or 'valid'})")
    if want is not None:
        close("gemm_" + kind, out, want, 1e-3)
    return "gemm_" + kind


def e_attention(rng, hostile):
    from ge_cpu.fused import attention

    dt = rng.choice([np.float32, np.float64])
    b, hd = rng.choice([0, 1, 2]), rng.choice([1, 2, 3])
    m, n, d, dv = dim(rng, 30), dim(rng, 30), dim(rng, 20), dim(rng, 20)
    q = arr(rng, (b, hd, m, d), dt)
    kt = arr(rng, (b, hd, d, n), dt)
    if rng.random() < 0.3:  # a transposed view of K
        kt = np.swapaxes(arr(rng, (b, hd, n, d), dt), -1, -2)
    v = arr(rng, (b, hd, n, dv), dt)
    mask = arr(rng, rng.choice([(n,), (m, n), (1, 1, m, n), (b, 1, 1, n)]), dt) if rng.random() < 0.3 else None
    out = None
    what = ""
    if hostile:
        r = rng.randrange(4)
        if r == 0:
            q, what = hostile_array(rng, q)
        elif r == 1:
            v, what = hostile_array(rng, v)
        elif r == 2:
            mask, what = hostile_array(rng, arr(rng, (m, n), dt))
        else:
            out, what = np.zeros((b, hd, m, dv), dt)[..., ::-1], "reversed output"
    scale = rng.choice([0.125, 1.0, float("nan")]) if hostile else 0.125
    res = through_wrapper("attention", what, lambda: attention.run(q, kt, v, mask, scale, out, rng.choice([1, 2])))
    if res is None:
        raise refused("attention", f"wrapper refused ({what or 'valid'})")
    if not what and not np.isnan(scale):
        s = np.matmul(np.asarray(q, np.float64), np.asarray(kt, np.float64)) * scale
        if mask is not None:
            s = s + np.asarray(mask, np.float64)
        if s.size:
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
        close("attention", res, np.matmul(s, np.asarray(v, np.float64)), 2e-3)
    return "attention_heads"
