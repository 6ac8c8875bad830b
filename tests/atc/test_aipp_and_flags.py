"""``--insert_op_conf`` (static AIPP), ``--input_format``, ``--output_type``, ``--oo_level``,
``--oo_constant_folding``, ``--oo_dead_code_elimination``, ``--optimization_switch``, and ``atc --help``.

GE's pages (hiascend ATC parameter pages; GE's repository pages under docs/zh/user_guides/
atc_tools/CLI_options/ were not in the stored index): ``--insert_op_conf`` (an aipp_op config:
crop, csc, mean_chn/min_chn/var_reci_chn, padding, uint8 input), ``--output_type`` (FP32/FP16/UINT8
for all outputs, or "node:index:FP16;..."), ``--oo_constant_folding`` .../atlasatcparam_16_0064.html,
``--oo_dead_code_elimination`` .../atlasatcparam_16_0065.html (a Switch with a constant predicate
loses its dead branch).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge

from .conftest import conv_net, ort_run, save_model

AIPP = """
aipp_op {
    aipp_mode : static
    input_format : RGB888_U8
    src_image_size_w : 20
    src_image_size_h : 18
    crop : true
    load_start_pos_h : 1
    load_start_pos_w : 3
    crop_size_w : 16
    crop_size_h : 16
    mean_chn_0 : 123
    mean_chn_1 : 117
    mean_chn_2 : 104
    min_chn_0 : 0.5
    var_reci_chn_0 : 0.0171
    var_reci_chn_1 : 0.0175
    var_reci_chn_2 : 0.0174
}
"""


def test_aipp_on_a_uint8_image_equals_the_model_on_the_normalised_input(tmp_path, atc):
    net = conv_net(tmp_path / "net.onnx")
    conf = tmp_path / "aipp.cfg"
    conf.write_text(AIPP)
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'a'}", f"--insert_op_conf={conf}", "--input_format=NCHW")
    assert rc == 0, err
    img = np.random.default_rng(0).integers(0, 256, (1, 18, 20, 3), dtype=np.uint8)
    model = ge.load_om(str(tmp_path / "a.om"))
    out = model.run({"x": img})["y"]
    crop = img[:, 1:17, 3:19, :].astype(np.float32)
    norm = (crop - np.array([123.5, 117, 104], np.float32)) * np.array([0.0171, 0.0175, 0.0174], np.float32)
    ref = ort_run(net, {"x": np.ascontiguousarray(norm.transpose(0, 3, 1, 2))})[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_aipp_csc_swap_and_padding_follow_ges_formula(tmp_path, atc):
    ident = save_model(tmp_path / "id.onnx", [helper.make_node("Identity", ["x"], ["y"], name="id")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 7])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = [[77, 150, 29], [-43, -85, 128], [128, -107, -21]]  # GE's RGB -> YUV (BT.601) Q8 matrix
    lines = [f"matrix_r{r}c{c} : {m[r][c]}" for r in range(3) for c in range(3)]
    conf = tmp_path / "csc.cfg"
    conf.write_text("aipp_op {\n aipp_mode : static\n input_format : RGB888_U8\n src_image_size_w : 5\n"
                    " src_image_size_h : 4\n rbuv_swap_switch : true\n csc_switch : true\n output_bias_0 : 0\n"
                    " output_bias_1 : 128\n output_bias_2 : 128\n padding : true\n top_padding_size : 1\n"
                    " bottom_padding_size : 1\n left_padding_size : 2\n right_padding_size : 0\n"
                    + "\n".join(lines) + "\n}\n")
    rc, _, err = atc(f"--model={ident}", f"--output={tmp_path / 'c'}", f"--insert_op_conf={conf}")
    assert rc == 0, err
    img = np.random.default_rng(1).integers(0, 256, (1, 4, 5, 3), dtype=np.uint8)
    out = ge.load_om(str(tmp_path / "c.om")).run({"x": img})["y"]
    x = img[..., ::-1].astype(np.float64)  # R/B swapped first
    yuv = np.clip(np.floor(x @ np.array(m, np.float64).T / 256) + [0, 128, 128], 0, 255)
    want = np.zeros((1, 6, 7, 3))
    want[:, 1:5, 2:7, :] = yuv
    np.testing.assert_array_equal(out, want.transpose(0, 3, 1, 2).astype(np.float32))


def test_aipp_config_errors_name_the_file_and_line(tmp_path, atc):
    net = conv_net(tmp_path / "net.onnx")
    conf = tmp_path / "bad.cfg"
    conf.write_text("aipp_op {\n aipp_mode : static\n input_format : RGB888_U8\n mean_chn_9 : 1\n}\n")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'b'}", f"--insert_op_conf={conf}")
    assert rc == 2 and "line 4" in err and "mean_chn_9" in err
    conf.write_text(AIPP.replace("crop_size_w : 16", "crop_size_w : 12"))
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'b'}", f"--insert_op_conf={conf}")
    assert rc == 2 and "width 12" in err and "wants 16" in err


def test_output_type_casts_the_named_output(tmp_path, atc):
    net = conv_net(tmp_path / "net.onnx")
    for spec in ("FP16", "relu2:0:FP16"):
        rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'o'}", f"--output_type={spec}")
        assert rc == 0, err
        model = ge.load_om(str(tmp_path / "o.om"))
        x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
        y = model.run({"x": x})["y"]
        assert y.dtype == np.float16 and model.output_names == ["y"]
        np.testing.assert_allclose(y, ort_run(net, {"x": x})[0].astype(np.float16), rtol=2e-3, atol=2e-3)
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'o'}", "--output_type=nosuch:0:FP16")
    assert rc == 2 and "nosuch:0" in err


def _if_model(path) -> str:
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    return save_model(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [cond])


def test_oo_flags_and_optimization_switch_reach_the_pass_manager(tmp_path, atc):
    model = _if_model(tmp_path / "if.onnx")
    x = np.array([-1, 2, -3, 4], np.float32)
    for flag, has_if in (("--oo_dead_code_elimination=true", False), ("--oo_dead_code_elimination=false", True)):
        rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'i'}", flag, f"--report={tmp_path / 'r.json'}")
        assert rc == 0, err
        m = ge.load_om(str(tmp_path / "i.om"))
        assert ("If" in m.report["op_counts"]) == has_if
        np.testing.assert_array_equal(m.run({"x": x})["y"], np.maximum(x, 0))
    net = conv_net(tmp_path / "net.onnx")
    passes = lambda om: [p["name"] for p in ge.load_om(om).report["passes"]]  # noqa: E731
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'o1'}", "--oo_level=O1")
    assert rc == 0, err
    assert "simplify_algebra" not in passes(str(tmp_path / "o1.om")) and "cse" in passes(str(tmp_path / "o1.om"))
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'o3'}", "--oo_level=O3", "--oo_constant_folding=false")
    assert rc == 0, err
    assert "distribute_constants" in passes(str(tmp_path / "o3.om"))
    assert ge.load_om(str(tmp_path / "o3.om")).options.constant_folding is False
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 's'}",
                     "--optimization_switch=CommonSubexpressionEliminationPass:off;distribute_constants:on")
    assert rc == 0, err
    names = passes(str(tmp_path / "s.om"))
    assert "cse" not in names and "distribute_constants" in names
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 's'}", "--optimization_switch=cse_pass:off")
    assert rc == 2 and "cse" in err


def test_help_lists_implemented_flags_first_and_ignored_ones_print_their_note_once(tmp_path, atc, capsys):
    from ge_atc.cli import build_atc_parser
    from ge_atc.flags import IGNORED, IMPLEMENTED, REFUSED

    text = build_atc_parser().format_help()
    first_ignored = text.index("accepted, no effect")
    assert all(text.index(f"--{f} ") < first_ignored for f in IMPLEMENTED if f"--{f} " in text)
    assert "NPU-only" in text and "Caffe-only" in text and "refused" in text
    net = conv_net(tmp_path / "net.onnx")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'h'}", "--op_select_implmode=high_precision",
                     "--enable_small_channel=1")
    assert rc == 0 and err.count("--op_select_implmode has no effect") == 1 and "--enable_small_channel" in err
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'h'}", "--singleop=ops.json")
    assert rc == 2 and "singleop" in err and "not supported" in err
    assert set(IMPLEMENTED).isdisjoint(REFUSED) and all(set(IMPLEMENTED).isdisjoint(g) for g in IGNORED.values())


def test_deterministic_gives_the_same_bits_at_any_thread_count(tmp_path, atc):
    """--deterministic=1: results that do not depend on how the run is split. Here: GE's thread
    pool (parallel=engine), whose splits depend on shapes only; BLAS's own threads give other bits
    at other thread counts."""
    from ge_atc.cli import build_atc_parser, compile_options

    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((512, 256)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    model = save_model(tmp_path / "mm.onnx", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 512])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'd'}", "--deterministic=1")
    assert rc == 0, err
    assert ge.load_om(str(tmp_path / "d.om")).options.extra["parallel"] == "engine"
    opts = compile_options(build_atc_parser().parse_args([f"--model={model}", "--deterministic=1"]))
    x = rng.standard_normal((256, 512)).astype(np.float32)
    runs = [ge.compile(model, {**opts, "threads": t}).run({"x": x})["y"] for t in (2, 3, 4)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert np.array_equal(runs[0], ge.compile(model, {**opts, "threads": 3}).run({"x": x})["y"])


def test_aipp_normalisation_is_fused_into_an_unpadded_first_conv(tmp_path, atc):
    """GE fuses AIPP into the model's first layer where it can: an unpadded first Conv absorbs
    the mean/var step (its weights and bias change), so no op runs for it."""
    import onnx

    net = conv_net(tmp_path / "net.onnx")
    m = onnx.load(net)
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "pads":
                a.ints[:] = [0, 0, 0, 0]
    onnx.save(m, net)
    conf = tmp_path / "aipp.cfg"
    conf.write_text(AIPP.replace("crop : true", "crop : false").replace("src_image_size_w : 20", "src_image_size_w : 16")
                    .replace("src_image_size_h : 18", "src_image_size_h : 16"))
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'f'}", f"--insert_op_conf={conf}")
    assert rc == 0, err
    model = ge.load_om(str(tmp_path / "f.om"))
    ops = model.report["op_counts"]
    # no Sub/Mul left (the convolutions run as the cpu backend's blocked ones where it has them)
    assert set(ops) <= {"Cast", "Transpose", "ge.fused::FusedConv", "Conv", "ge.cpu::NchwcConv",
                        "ge.cpu::NchwcReorderOutput"}, ops
    img = np.random.default_rng(3).integers(0, 256, (1, 16, 16, 3), dtype=np.uint8)
    norm = (img.astype(np.float32) - np.array([123.5, 117, 104], np.float32)) * np.array([0.0171, 0.0175, 0.0174],
                                                                                           np.float32)
    ref = ort_run(net, {"x": np.ascontiguousarray(norm.transpose(0, 3, 1, 2))})[0]
    np.testing.assert_allclose(model.run({"x": img})["y"], ref, rtol=1e-4, atol=1e-5)


def test_aipp_yuv420sp_to_rgb(tmp_path, atc):
    """YUV420SP_U8 (NV12) input with GE's YUV -> RGB csc matrix (JPEG full range, input_bias
    0/128/128): each pixel's Y with the U,V of its 2x2 block, by GE's Q8 formula."""
    ident = save_model(tmp_path / "id.onnx", [helper.make_node("Identity", ["x"], ["y"], name="id")],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 6])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = [[256, 0, 359], [256, -88, -183], [256, 454, 0]]
    conf = tmp_path / "nv12.cfg"
    conf.write_text("aipp_op {\n aipp_mode : static\n input_format : YUV420SP_U8\n src_image_size_w : 6\n"
                    " src_image_size_h : 4\n csc_switch : true\n input_bias_0 : 0\n input_bias_1 : 128\n"
                    " input_bias_2 : 128\n" + "\n".join(f" matrix_r{r}c{c} : {m[r][c]}" for r in range(3)
                                                        for c in range(3)) + "\n}\n")
    rc, _, err = atc(f"--model={ident}", f"--output={tmp_path / 'n'}", f"--insert_op_conf={conf}")
    assert rc == 0, err
    rng = np.random.default_rng(4)
    yplane = rng.integers(0, 256, (4, 6), dtype=np.uint8)
    uv = rng.integers(0, 256, (2, 3, 2), dtype=np.uint8)
    nv12 = np.concatenate([yplane, uv.reshape(2, 6)], axis=0).reshape(1, 6, 6, 1)
    out = ge.load_om(str(tmp_path / "n.om")).run({"x": nv12})["y"]
    full_uv = uv.repeat(2, axis=0).repeat(2, axis=1).astype(np.float64)
    yuv = np.concatenate([yplane[..., None].astype(np.float64), full_uv], axis=2) - [0, 128, 128]
    rgb = np.clip(np.floor(yuv @ np.array(m, np.float64).T / 256), 0, 255)
    np.testing.assert_array_equal(out[0], rgb.transpose(2, 0, 1).astype(np.float32))


def test_input_format_and_flag_partners_follow_ge(tmp_path, atc):
    """--input_format: ATC takes NCHW, ND or NCDHW for an ONNX model; --keep_dtype needs a
    reducing --precision_mode and --modify_mixlist an allow_mix_precision one (else a note)."""
    net = conv_net(tmp_path / "net.onnx")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'f'}", "--input_format=NHWC")
    assert rc == 2 and "NCHW" in err and "onnx" in err
    keep = tmp_path / "keep.cfg"
    keep.write_text("conv1\n")
    mix = tmp_path / "mix.json"
    mix.write_text("{}")
    rc, _, err = atc(f"--model={net}", f"--output={tmp_path / 'f'}", f"--keep_dtype={keep}", f"--modify_mixlist={mix}",
                     "--input_format=NCHW")
    assert rc == 0 and "--keep_dtype has no effect" in err and "--modify_mixlist has no effect" in err


def test_dead_branch_inside_a_loop_body_reading_outer_values(tmp_path, atc):
    """The If sits in a Loop body, its condition folds to a constant (Greater of two constants)
    and its branch reads the body's and the main graph's values: inlined, it computes what
    onnxruntime computes."""
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Add", ["acc", "x"], ["t"], name="then_add")], "then", [],
                               [helper.make_tensor_value_info("t", f, [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["acc", "x"], ["e"], name="else_sub")], "else", [],
                               [helper.make_tensor_value_info("e", f, [3])])
    body = helper.make_graph(
        [helper.make_node("Greater", ["two", "one"], ["c"], name="cmp"),
         helper.make_node("If", ["c"], ["acc_out"], name="branch", then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", f, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", f, [3])])
    inits = [numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go"),
             numpy_helper.from_array(np.float32(2), "two"), numpy_helper.from_array(np.float32(1), "one")]
    nodes = [helper.make_node("Loop", ["trips", "go", "x"], ["y"], name="loop", body=body)]
    model = save_model(tmp_path / "loop.onnx", nodes, [helper.make_tensor_value_info("x", f, [3])],
                       [helper.make_tensor_value_info("y", f, [3])], inits)
    rc, _, err = atc(f"--model={model}", f"--output={tmp_path / 'l'}")
    assert rc == 0, err
    m = ge.load_om(str(tmp_path / "l.om"))
    loop = next(n for n in m.graph.node_list() if n.op_type == "Loop")
    assert not any(n.op_type == "If" for n in loop.subgraphs()[0].node_list())
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_allclose(m.run({"x": x})["y"], ort_run(model, {"x": x})[0], rtol=1e-6)


def test_dead_branch_elimination_leaves_an_if_whose_branch_values_are_read_elsewhere():
    """A branch value another scope reads (ONNX's affine_grid function expansion, after CSE)
    keeps its If: inlining would orphan that reader. The model still compiles and matches."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from tests.conformance.runner import cases, run_case

    case = next(c for c in cases() if c.name == "test_affine_grid_2d_align_corners_expanded")
    assert run_case(case) is None
