"""ge viz on real models: onnx's light_resnet50 (415 nodes, 239 of them ConstantOfShape weights)
fits in 20,000 px with its constants folded into their consumers and shapes on the edges; a
2,000-node model lays out without overlapping boxes; the page has zoom, pan and search."""

import re
import sys
import time
import xml.etree.ElementTree as ET

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main
from ge_sdk.viz import Drawing, constant_nodes, render
from tests.conftest import light_model_path

SVG = "{http://www.w3.org/2000/svg}"


def _size(path):
    root = ET.parse(path).getroot()
    return root, float(root.get("width")), float(root.get("height"))


def _boxes(root):
    out = []
    for g in root.iter(SVG + "g"):
        r = g.find(SVG + "rect")
        cls = g.get("class") or ""
        if r is not None and (cls.startswith("node") or cls == "io"):
            out.append((float(r.get("x")), float(r.get("y")), float(r.get("width")), float(r.get("height"))))
    return out


def _overlaps(boxes):
    rows = {}
    for b in boxes:
        rows.setdefault(round(b[1]), []).append(b)
    bad = 0
    for row in rows.values():
        row.sort()
        bad += sum(1 for a, b in zip(row, row[1:]) if a[0] + a[2] > b[0] + 0.5)
    return bad


def test_light_resnet50_fits_with_constants_folded_and_shapes_on_edges(tmp_path, capsys):
    src = light_model_path("resnet50")
    graph = ge.load(src)
    const = constant_nodes(graph)
    assert sum(n.op_type == "ConstantOfShape" for n in graph.nodes) == 239
    assert {n.op_type for n in const} == {"ConstantOfShape"}
    out = tmp_path / "r50.svg"
    assert main(["viz", src, "-o", str(out)]) == 0
    root, w, h = _size(out)
    assert w <= 20000 and h <= 20000, (w, h)
    assert root.get("data-layout") == "grandalf (Sugiyama)"
    text = out.read_text()
    assert "ConstantOfShape" not in re.sub(r"<title>.*?</title>", "", text, flags=re.S)  # folded, only in tooltips
    assert text.count('class="node') == len(graph) - len(const) == 176
    assert "+1 const" in text or "+2 const" in text
    shapes = re.findall(r'class="shape"[^>]*>([^<]*)<', text)
    assert "1×64×112×112" in shapes and "1×3×224×224" in shapes and "?" not in shapes
    assert _overlaps(_boxes(root)) == 0
    # compiled: fused groups, same bounds
    ge.compile(src).save(str(tmp_path / "r50.om"))
    assert main(["viz", str(tmp_path / "r50.om"), "-o", str(tmp_path / "om.html")]) == 0
    page = (tmp_path / "om.html").read_text()
    assert 'id="q"' in page and "addEventListener('wheel'" in page
    # (the convolutions: fused, or the cpu backend's blocked ones where its AVX-512 kernels run)
    assert 'data-op="ge.fused::FusedConv"' in page or 'data-op="ge.cpu::NchwcConv"' in page


def _big(path, n=2000):
    """A 2,000-node graph: a chain of Relu/Add/Mul with skip connections every few nodes."""
    rng = np.random.default_rng(0)
    nodes, prev, skip = [], "x", "x"
    inits = [numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "c")]
    for i in range(n):
        out = f"v{i}"
        if i % 5 == 4:
            nodes.append(helper.make_node("Add", [prev, skip], [out], name=f"add{i}"))
            skip = out
        elif i % 5 == 2:
            nodes.append(helper.make_node("Mul", [prev, "c"], [out], name=f"mul{i}"))
        else:
            nodes.append(helper.make_node("Relu", [prev], [out], name=f"relu{i}"))
        prev = out
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 8])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_2000_node_model_lays_out_without_overlaps(tmp_path):
    graph = ge.load(_big(str(tmp_path / "big.onnx")))
    assert len(graph) == 2000
    t0 = time.perf_counter()
    out = render(graph, str(tmp_path / "big.svg"))
    seconds = time.perf_counter() - t0
    root, w, h = _size(out)
    boxes = _boxes(root)
    assert len(boxes) == 2000 + 2 and _overlaps(boxes) == 0
    assert w < 2000 and seconds < 60, (w, seconds)
    assert "1×8" in open(out).read()


def test_without_grandalf_the_builtin_layout_draws_the_same_items(tmp_path, monkeypatch):
    graph = ge.load(light_model_path("squeezenet"))
    with_engine = Drawing(graph)
    monkeypatch.setitem(sys.modules, "grandalf", None)  # import grandalf now raises ImportError
    plain = Drawing(graph)
    assert plain.engine == "built-in layers" and with_engine.engine.startswith("grandalf")
    assert set(map(id, plain.pos)) == set(map(id, plain.items)) and len(plain.items) == len(with_engine.items)
    out = render(graph, str(tmp_path / "s.svg"))
    root, w, h = _size(out)
    assert root.get("data-layout") == "built-in layers" and _overlaps(_boxes(root)) == 0
