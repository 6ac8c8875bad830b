"""``atc --mode=3`` (pre-check, ``--check_report``) and ``--mode=6`` (display .om info).

GE's pages: ``--mode`` https://www.hiascend.com/document/detail/zh/canncommercial/latest/devaids/atctool/atlasatcparam_16_0009.html
(3: pre-check only, the model's content checked; 6: show an .om's key resources and build
environment), ``--check_report`` .../atlasatcparam_16_0031.html (default check_result.json in the
current folder). GE's repository pages under docs/zh/user_guides/atc_tools/CLI_options/ were not
in the stored index; the report layout follows GE's PreChecker::Save (parser/common/pre_checker.cc):
name, result, total, pass, fail, op[{name, type, result, cause[{code, message}]}].
"""

from __future__ import annotations

import json
import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .conftest import conv_net, save_model


def _custom_op_model(path) -> str:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("MyCustomOp", ["c"], ["d"], name="custom1", domain="my.domain"),
             helper.make_node("Relu", ["d"], ["y"], name="relu1")]
    return save_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
                      opsets=(("", 17), ("my.domain", 1)))


def test_mode3_names_the_unsupported_op_and_node_and_writes_no_om(tmp_path, atc, monkeypatch):
    """--mode=3: pre-check only; the report names the node whose op no plugin runs; no .om."""
    model = _custom_op_model(tmp_path / "bad.onnx")
    monkeypatch.chdir(tmp_path)
    rc, out, err = atc("--mode=3", f"--model={model}", "--framework=5", "--output=never")
    assert rc == 1
    assert "custom1" in err and "MyCustomOp" in err
    assert not any(p.suffix == ".om" for p in tmp_path.iterdir())
    report = json.loads((tmp_path / "check_result.json").read_text())  # GE's default name, current folder
    assert report["result"] == "failed" and (report["total"], report["pass"], report["fail"]) == (3, 2, 1)
    by_name = {op["name"]: op for op in report["op"]}
    assert [op["name"] for op in report["op"]] == ["conv1", "custom1", "relu1"]
    bad = by_name["custom1"]
    assert bad["type"] == "MyCustomOp" and bad["result"] == "failed" and bad["support"] == "none"
    assert bad["cause"][0]["code"] == "TYPE_UNSUPPORTED"
    assert by_name["conv1"]["result"] == "success" and by_name["conv1"]["support"] == "native"


def test_mode3_attribute_the_kernel_refuses_and_reference_fallback(tmp_path, atc):
    """Every node is built as the compile builds it: an attribute the kernel refuses fails with
    the node named; an op only the onnx.reference fallback runs is reported as such."""
    nodes = [helper.make_node("Mod", ["x", "x"], ["m"], name="mod_c_style", fmod=0),
             helper.make_node("Det", ["m"], ["y"], name="det1")]
    model = save_model(tmp_path / "m.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    report_path = tmp_path / "out" / "r.json"
    os.makedirs(report_path.parent)
    rc, out, err = atc("--mode=3", f"--model={model}", f"--check_report={report_path}")
    report = json.loads(report_path.read_text())
    by_name = {op["name"]: op for op in report["op"]}
    assert by_name["det1"]["support"] == "reference" and by_name["det1"]["result"] == "success"
    mod = by_name["mod_c_style"]
    if mod["result"] == "failed":  # the reference evaluator refuses it too: the native reason names it
        assert rc == 1 and "fmod" in mod["cause"][0]["message"] and mod["support"] == "none"
    else:
        assert rc == 0 and mod["support"] == "reference" and "fmod" in mod["cause"][0]["message"]


def test_mode3_passes_a_supported_model(tmp_path, atc):
    model = conv_net(tmp_path / "net.onnx")
    rc, out, err = atc("--mode=3", f"--model={model}", f"--check_report={tmp_path / 'c.json'}")
    report = json.loads((tmp_path / "c.json").read_text())
    assert rc == 0 and report["result"] == "success" and report["fail"] == 0 and report["total"] == 4
    assert {op["support"] for op in report["op"]} == {"native"}


def test_mode6_displays_model_info(tmp_path, atc):
    """--mode=6 --om=X.om prints GE's model info block: the atc command line, versions, and the
    memory/weight sizes and stream/event counts."""
    model = conv_net(tmp_path / "net.onnx")
    rc, _, _ = atc(f"--model={model}", "--framework=5", f"--output={tmp_path / 'net'}", f"--report={tmp_path / 'r.json'}")
    assert rc == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rc, out, _ = atc("--mode=6", f"--om={tmp_path / 'net.om'}")
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0] == "============ Display Model Info start ============"
    assert lines[-1].startswith("============ Display Model Info end")
    assert lines[1].startswith("Original Atc command line: atc") and "--framework=5" in lines[1]
    assert "framework_type[5(onnx)]" in lines[2] and "soc_version[cpu]" in lines[2]
    assert f"memory_size[{report['memory']['arena_bytes']} B]" in lines[3]
    assert f"weight_size[{report['memory']['weights_bytes']} B]" in lines[3]
    assert f"stream_num[{report['streams']['count']}]" in lines[3]


def test_mode0_that_fails_on_unsupported_ops_writes_the_check_report(tmp_path, atc):
    """--check_report: "when --mode=0 fails to parse the graph" the pre-check result is written too."""
    model = _custom_op_model(tmp_path / "bad.onnx")
    report_path = tmp_path / "why.json"
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'never'}", f"--check_report={report_path}")
    assert rc == 2 and "MyCustomOp" in err and str(report_path) in err
    assert not (tmp_path / "never.om").exists()
    report = json.loads(report_path.read_text())
    assert report["result"] == "failed" and [op["name"] for op in report["op"] if op["result"] == "failed"] == ["custom1"]
