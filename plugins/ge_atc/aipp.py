"""ATC's ``--insert_op_conf`` (static AIPP) and ``--input_format``.

An AIPP config is protobuf text: one ``aipp_op { ... }`` block per model input it preprocesses
(``related_input_rank``, 0 by default). With ``aipp_mode: static`` the model's input becomes a
uint8 NHWC image (``src_image_size_h`` x ``src_image_size_w``, channels from ``input_format``) and
these steps run in front of the model, as ops of the graph, in GE's order:

1. crop (``crop``, ``load_start_pos_h/w``, ``crop_size_h/w``);
2. R/B (or U/V) swap (``rbuv_swap_switch``) and, for XRGB8888_U8, dropping the X channel
   (``ax_swap_switch`` says X comes last);
3. colour-space conversion (``csc_switch``): ``out = floor(M (x - input_bias) / 256) + output_bias``
   clipped to 0..255, M from ``matrix_r0c0``..``matrix_r2c2`` (GE's Q8 integer matrix);
4. ``(x - mean_chn_i - min_chn_i) * var_reci_chn_i`` per channel (float32 here, float16 on the NPU),
   folded into the first layer's weights and bias when every reader of the input is an unpadded
   Conv with constant weights (a padded border would be zeros of the normalised image);
5. padding (``padding``, ``left/right/top/bottom_padding_size``, ``padding_value``);
6. NHWC -> the model's layout (``--input_format``; NCHW unless it says NHWC).

Input formats: RGB888_U8, BGR888_U8 (3 channels), XRGB8888_U8 / ARGB8888_U8 (4, one dropped),
YUV400_U8 (1), YUV420SP_U8 (NV12: the input is uint8 ``[N, H*3/2, W, 1]``, H rows of Y then H/2
rows of interleaved U,V, each pair covering 2x2 pixels; ``rbuv_swap_switch`` reads NV21). The
packed YUV formats (YUYV, YUV422SP, AYUV444) are refused with a message. Dynamic AIPP (``aipp_mode: dynamic``) is refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ge_core.errors import OptionError
from ge_core.ir.graph import Graph, Value
from ge_core.ir.types import TensorType
from ge_core.passes import PassContext
from ge_core.registry import close_matches

from .files import read_text

MAX_CONF_BYTES = 1 << 20
CHANNELS = {"RGB888_U8": 3, "BGR888_U8": 3, "XRGB8888_U8": 4, "ARGB8888_U8": 4, "RGBA8888_U8": 4, "YUV400_U8": 1,
            "YUV420SP_U8": 3}
_INT_KEYS = ("related_input_rank src_image_size_w src_image_size_h load_start_pos_h load_start_pos_w crop_size_w "
             "crop_size_h left_padding_size right_padding_size top_padding_size bottom_padding_size").split()
_BOOL_KEYS = "crop padding csc_switch rbuv_swap_switch ax_swap_switch".split()
_NUM_KEYS = ([f"matrix_r{r}c{c}" for r in range(3) for c in range(3)] + [f"output_bias_{i}" for i in range(3)]
             + [f"input_bias_{i}" for i in range(3)] + [f"{k}_chn_{i}" for k in ("mean", "min", "var_reci")
                                                         for i in range(4)] + ["padding_value"])
_ENUM_KEYS = {"aipp_mode": ("static", "dynamic"), "input_format": tuple(CHANNELS) + ("YUYV_U8",
                                                                                     "YUV422SP_U8", "AYUV444_U8")}
KEYS = _INT_KEYS + _BOOL_KEYS + _NUM_KEYS + list(_ENUM_KEYS)
FORMATS = ("NCHW", "NHWC", "ND", "NCDHW", "NDHWC")

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|([A-Za-z_][A-Za-z0-9_]*)|(\{)|(\})|(:)|("[^"\n]*")|([-+0-9.eE]+))')


def parse_aipp(text: str, where: str) -> list[dict[str, Any]]:
    """The ``aipp_op`` blocks of an AIPP config, each a dict of checked values."""
    pos, tokens = 0, []
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            line = text.count("\n", 0, pos) + 1
            raise OptionError(f"{where} line {line}: cannot read '{text[pos:pos + 20].strip()}'",
                              hint="an AIPP config is aipp_op { key : value ... } blocks")
        pos = m.end()
        if m.group(1) is None:
            tok = next(g for g in m.groups()[1:] if g is not None)
            tokens.append((tok, text.count("\n", 0, m.start(m.lastindex or 0)) + 1))
    blocks: list[dict[str, Any]] = []
    i = 0
    while i < len(tokens):
        tok, line = tokens[i]
        if tok != "aipp_op" or i + 1 >= len(tokens) or tokens[i + 1][0] != "{":
            raise OptionError(f"{where} line {line}: expected 'aipp_op {{', found '{tok}'")
        i += 2
        block: dict[str, Any] = {}
        while i < len(tokens) and tokens[i][0] != "}":
            key, line = tokens[i]
            if i + 2 >= len(tokens) or tokens[i + 1][0] != ":":
                raise OptionError(f"{where} line {line}: expected '{key} : value'")
            block[_key(key, where, line)] = _value(key, tokens[i + 2][0].strip('"'), where, line)
            i += 3
        if i >= len(tokens):
            raise OptionError(f"{where}: an aipp_op block is not closed with '}}'")
        i += 1
        blocks.append(block)
    if not blocks:
        raise OptionError(f"{where} has no aipp_op block")
    ranks = [b.get("related_input_rank", 0) for b in blocks]
    if len(set(ranks)) != len(ranks):
        raise OptionError(f"{where}: two aipp_op blocks have the same related_input_rank")
    for b in blocks:
        _check_block(b, where)
    return blocks


def _key(key: str, where: str, line: int) -> str:
    if key not in KEYS:
        raise OptionError(f"{where} line {line}: unknown AIPP parameter '{key}'{close_matches(key, KEYS)}")
    return key


def _value(key: str, raw: str, where: str, line: int) -> Any:
    bad = OptionError(f"{where} line {line}: {key} : {raw} is not a valid value")
    if key in _BOOL_KEYS:
        if raw not in ("true", "false", "1", "0"):
            raise bad
        return raw in ("true", "1")
    if key in _ENUM_KEYS:
        if raw not in _ENUM_KEYS[key]:
            raise OptionError(f"{where} line {line}: {key} : {raw} is not one of {', '.join(_ENUM_KEYS[key])}")
        return raw
    try:
        v = float(raw)
    except ValueError:
        raise bad from None
    if not np.isfinite(v):
        raise bad
    if key in _INT_KEYS:
        if v != int(v) or not 0 <= v <= 1 << 16:
            raise bad
        return int(v)
    return v


def _check_block(b: dict[str, Any], where: str) -> None:
    if b.get("aipp_mode", "static") != "static":
        raise OptionError(f"{where}: aipp_mode {b['aipp_mode']} is not supported", hint="use aipp_mode : static")
    fmt = b.get("input_format")
    if fmt is None:
        raise OptionError(f"{where}: an aipp_op block needs input_format (e.g. RGB888_U8)")
    if fmt not in CHANNELS:
        raise OptionError(f"{where}: input_format {fmt} is not supported here",
                          hint=f"supported: {', '.join(CHANNELS)} (the packed YUV formats are not built)")
    if not b.get("src_image_size_w") or not b.get("src_image_size_h"):
        raise OptionError(f"{where}: static AIPP needs src_image_size_w and src_image_size_h")
    if fmt == "YUV420SP_U8" and (b["src_image_size_w"] % 2 or b["src_image_size_h"] % 2 or (
            b.get("crop") and (b.get("load_start_pos_h", 0) % 2 or b.get("load_start_pos_w", 0) % 2))):
        raise OptionError(f"{where}: YUV420SP_U8 needs an even image size and even crop start positions")
    if b.get("csc_switch") and CHANNELS[fmt] == 1:
        raise OptionError(f"{where}: csc_switch needs 3 colour channels, input_format {fmt} has one")
    if b.get("crop"):
        h, w = b.get("crop_size_h", 0), b.get("crop_size_w", 0)
        if not h or not w:
            raise OptionError(f"{where}: crop needs crop_size_h and crop_size_w")
        if b.get("load_start_pos_h", 0) + h > b["src_image_size_h"] or b.get("load_start_pos_w", 0) + w > b["src_image_size_w"]:
            raise OptionError(f"{where}: the crop window lies outside the {b['src_image_size_h']}x"
                              f"{b['src_image_size_w']} source image")


def read_aipp_option(value: Any) -> dict[str, Any]:
    text = read_text(value, "insert_op_conf", MAX_CONF_BYTES)
    return {"aipp_config": json.dumps(parse_aipp(text, f"insert_op_conf file '{value}'"))}


def read_input_format_option(value: Any) -> dict[str, Any]:
    if str(value).strip().upper() not in FORMATS:
        raise OptionError(f"input_format '{value}' is not one of {', '.join(FORMATS)}")
    return {}


def aipp_pass(graph: Graph, ctx: PassContext) -> bool:
    """Put the static AIPP of ``insert_op_conf`` in front of the model's inputs."""
    conf = ctx.options.getoption("aipp_config", "")
    if not conf:
        return False
    layout = str(ctx.options.getoption("input_format", "") or "NCHW").upper()
    opset = graph.opset_imports.get("", 0) or graph.opset_imports.get("ai.onnx", 0)
    if opset and opset < 13:
        raise OptionError(f"insert_op_conf: the model imports ONNX opset {opset}; AIPP ops need 13 or later")
    for block in json.loads(conf):
        rank = block.get("related_input_rank", 0)
        if rank >= len(graph.inputs):
            raise OptionError(f"insert_op_conf: related_input_rank {rank} but the model has "
                              f"{len(graph.inputs)} input(s)")
        _insert(graph, graph.inputs[rank], block, layout, ctx.ops)
    return True


def _insert(graph: Graph, x: Value, b: dict[str, Any], layout: str, ops) -> None:
    """Put the steps of AIPP block ``b`` between input ``x`` (now uint8 NHWC) and its readers.
    The pass runs after type inference: each new node's types are inferred here (``ops``), and
    the readers see the float32 tensor of the layout they had."""
    f32 = np.dtype(np.float32)
    shape = x.type.shape
    if shape is None or len(shape) != 4:
        raise OptionError(f"insert_op_conf: AIPP input '{x.name}' must be 4-d (an image batch), the model says {x.type}",
                          hint="give its shape with --input_shape")
    if x.type.dtype is not None and x.type.dtype != f32:
        raise OptionError(f"insert_op_conf: AIPP input '{x.name}' is {x.type.dtype}, AIPP feeds float32 inputs")
    n = shape[0]
    model_c, model_h, model_w = (shape[1], shape[2], shape[3]) if layout != "NHWC" else (shape[3], shape[1], shape[2])
    fmt = b["input_format"]
    cin = CHANNELS[fmt]
    cout = 1 if cin == 1 else 3
    h, w = (b["crop_size_h"], b["crop_size_w"]) if b.get("crop") else (b["src_image_size_h"], b["src_image_size_w"])
    pads = [b.get(k, 0) if b.get("padding") else 0 for k in ("top_padding_size", "bottom_padding_size",
                                                              "left_padding_size", "right_padding_size")]
    out_h, out_w = h + pads[0] + pads[1], w + pads[2] + pads[3]
    for want, got, what in ((model_c, cout, "channels"), (model_h, out_h, "height"), (model_w, out_w, "width")):
        if isinstance(want, int) and want != got:
            raise OptionError(f"insert_op_conf: AIPP gives input '{x.name}' {what} {got}, the model wants {want} "
                              f"({x.type}, layout {layout})", hint="check crop/padding sizes and --input_format")
    if x.is_graph_output:
        raise OptionError(f"insert_op_conf: input '{x.name}' is also an output of the model; AIPP cannot change it")
    uses = x.uses()
    src_h, src_w = b["src_image_size_h"], b["src_image_size_w"]
    if fmt == "YUV420SP_U8":  # NV12: H rows of Y, then H/2 rows of interleaved U,V at half width
        x.type = TensorType(np.dtype(np.uint8), (n, src_h * 3 // 2, src_w, 1))
    else:
        x.type = TensorType(np.dtype(np.uint8), (n, src_h, src_w, cin))
    before = next(iter(graph.nodes), None)

    def node(op: str, ins: list[Value], attrs: dict[str, Any] | None = None) -> Value:
        nd = graph.add_node(op, ins, attrs or {}, name=f"aipp_{x.name}_{op.lower()}", before=before)
        ops.infer_node(nd, graph.opset_imports)
        return nd.output

    def const(a: Any, dtype: Any = np.float32) -> Value:
        return graph.add_constant(np.asarray(a, dtype=dtype), graph.names.fresh(f"aipp_{x.name}_c"))

    v = x
    if fmt == "YUV420SP_U8":  # to YUV 4:4:4: each U,V pair covers 2x2 pixels
        i64 = np.int64
        y = node("Slice", [v, const([0], i64), const([src_h], i64), const([1], i64)])
        uv = node("Slice", [v, const([src_h], i64), const([src_h * 3 // 2], i64), const([1], i64)])
        uv = node("Reshape", [uv, const([-1, src_h // 2, 1, src_w // 2, 1, 2], i64)])
        uv = node("Expand", [uv, const([1, 1, 2, 1, 2, 1], i64)])
        uv = node("Reshape", [uv, const([-1, src_h, src_w, 2], i64)])
        v = node("Concat", [y, uv], {"axis": 3})
        cin = 3
    if b.get("crop"):
        y0, x0 = b.get("load_start_pos_h", 0), b.get("load_start_pos_w", 0)
        v = node("Slice", [v, const([y0, x0], np.int64), const([y0 + h, x0 + w], np.int64), const([1, 2], np.int64)])
    v = node("Cast", [v], {"to": 1})
    if cin == 4:  # XRGB / ARGB: X first unless ax_swap_switch says last; RGBA: last
        keep = [0, 1, 2] if (fmt == "RGBA8888_U8" or b.get("ax_swap_switch")) else [1, 2, 3]
        v = node("Gather", [v, const(keep, np.int64)], {"axis": 3})
    if b.get("rbuv_swap_switch") and cout == 3:
        v = node("Gather", [v, const([2, 1, 0], np.int64)], {"axis": 3})
    if b.get("csc_switch"):
        m = np.array([[b.get(f"matrix_r{r}c{c}", 0.0) for c in range(3)] for r in range(3)], dtype=np.float32)
        ib = [b.get(f"input_bias_{i}", 0.0) for i in range(3)]
        ob = [b.get(f"output_bias_{i}", 0.0) for i in range(3)]
        v = node("Sub", [v, const(ib)])
        v = node("MatMul", [v, const(m.T / 256.0)])
        v = node("Floor", [v])
        v = node("Add", [v, const(ob)])
        v = node("Max", [v, const(0.0)])
        v = node("Min", [v, const(255.0)])
    mean = [b.get(f"mean_chn_{i}", 0.0) + b.get(f"min_chn_{i}", 0.0) for i in range(cout)]
    var = [b.get(f"var_reci_chn_{i}", 1.0) for i in range(cout)]
    if layout != "NHWC" and not any(pads) and uses and all(_foldable(u, i, cout) for u, i in uses):
        for u, _ in uses:  # the first layer absorbs the normalisation: no op for it at run time
            _fold_into_conv(graph, u, np.asarray(mean, np.float64), np.asarray(var, np.float64))
        mean, var = [0.0] * cout, [1.0] * cout
    if any(mean):
        v = node("Sub", [v, const(mean)])
    if any(r != 1.0 for r in var):
        v = node("Mul", [v, const(var)])
    if any(pads):
        full = [0, pads[0], pads[2], 0, 0, pads[1], pads[3], 0]
        v = node("Pad", [v, const(full, np.int64), const(b.get("padding_value", 0.0))], {"mode": "constant"})
    if layout != "NHWC":
        v = node("Transpose", [v], {"perm": [0, 3, 1, 2]})
    for u, i in uses:
        u.set_input(i, v)


def _foldable(node, i: int, channels: int) -> bool:
    """A Conv reading the AIPP output as its data input, without padding (a padded border would
    be zeros of the normalised image, not of the raw one) and with constant float32 weights."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or i != 0:
        return False
    a = node.attrs
    if int(a.get("group", 1)) != 1 or any(int(p) for p in a.get("pads", ()) or ()) or \
            str(a.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID"):
        return False
    w = node.inputs[1] if len(node.inputs) > 1 else None
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return (w is not None and w.const_value is not None and w.const_value.dtype == np.float32
            and w.const_value.ndim == 4 and w.const_value.shape[1] == channels
            and (bias is None or (bias.const_value is not None and bias.const_value.dtype == np.float32)))


def _fold_into_conv(graph: Graph, conv, mean: np.ndarray, scale: np.ndarray) -> None:
    """conv(W, (x - mean) * scale) + b == conv(W * scale, x) + (b - sum(W * scale * mean))."""
    w = np.asarray(conv.inputs[1].const_value, np.float64)
    ws = w * scale[None, :, None, None]
    bias_in = conv.inputs[2] if len(conv.inputs) > 2 else None
    b = np.zeros(w.shape[0]) if bias_in is None else np.asarray(bias_in.const_value, np.float64)
    b2 = b - (ws * mean[None, :, None, None]).sum(axis=(1, 2, 3))
    conv.set_input(1, graph.add_constant(ws.astype(np.float32), graph.names.fresh(f"{conv.name}_aipp_w")))
    nb = graph.add_constant(b2.astype(np.float32), graph.names.fresh(f"{conv.name}_aipp_b"))
    if bias_in is None:
        conv.add_input(nb)
    else:
        conv.set_input(2, nb)
