"""The ONNX frontend: IR built from models, external data safety, errors, options."""

import collections
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ge_core.errors import GEError, ModelFileError, OptionError, SecurityError, UnsupportedOpError
from ge_core.ir.graph import Graph
from ge_core.options import CompileOptions

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))


def _frontend():
    from ge_onnx.frontend import OnnxFrontend

    return OnnxFrontend()


def load(source, **opts):
    return _frontend().load(source, CompileOptions.from_any(opts))


def _model(nodes, inputs, outputs, initializers=(), opset=17, **kw):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)


def _frontend_type(dtype, shape):
    from ge_core.ir.types import TensorType

    return TensorType(np.dtype(dtype), shape)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _add_model():
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    return _model(
        [helper.make_node("Add", ["x", "w"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")],
        [_vi("x", ["N", 3])],
        [_vi("y", ["N", 3])],
        [w],
    )


# ------------------------------------------------------------------------------------------
# light models
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fname", LIGHT_MODELS)
def test_light_model_ir(onnx_host, fname):
    path = os.path.join(LIGHT_DIR, fname)
    m = onnx.load(path)
    g = load(path)
    assert collections.Counter(n.op_type for n in g.nodes) == collections.Counter(n.op_type for n in m.graph.node)
    inits = {t.name for t in m.graph.initializer}
    assert [v.name for v in g.inputs] == [i.name for i in m.graph.input if i.name not in inits]
    assert len(g.constants) == len(m.graph.initializer)
    for t in m.graph.initializer[:5]:
        np.testing.assert_array_equal(g.constants[t.name].const_value, numpy_helper.to_array(t))
    assert [v.name for v in g.outputs] == [o.name for o in m.graph.output]
    assert g.opset_imports == {"": 9}
    assert g.metadata["ir_version"] == m.ir_version
    assert g.inputs[0].type.dtype == np.float32 and g.inputs[0].type.shape == (1, 3, 224, 224)
    g.verify()


def test_modelproto_and_bytes_sources_and_no_mutation(onnx_host):
    m = _add_model()
    before = m.SerializeToString()
    g1 = load(m)
    g2 = load(before)
    assert m.SerializeToString() == before
    assert [n.op_type for n in g1.nodes] == [n.op_type for n in g2.nodes] == ["Add", "Relu"]
    assert g1.inputs[0].type.shape == ("N", 3)
    assert g1.outputs[0].type.dtype == np.float32


def test_frontend_identity_and_sniff(onnx_host, tmp_path):
    fe = _frontend()
    assert fe.name == "onnx" and fe.framework_ids == (5,) and ".onnx" in fe.suffixes
    m = _add_model()
    assert fe.accepts_object(m) and not fe.accepts_object("x")
    p = tmp_path / "model.bin"
    p.write_bytes(m.SerializeToString())
    assert fe.sniff(str(p), p.read_bytes()[:64])
    assert fe.sniff("a.onnx", b"")
    assert not fe.sniff("a.pb", b"\x0a\x05hello")
    assert not fe.sniff("saved_model.pb", b"\x08\x01\x12\x80\x01")  # a TensorFlow SavedModel
    assert not fe.sniff("model.bin", b"\x08\x01\x12\x80\x01")


# ------------------------------------------------------------------------------------------
# bad files
# ------------------------------------------------------------------------------------------
def test_garbage_file(onnx_host, tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\xff\xfe this is not a protobuf \x00\x01\x02" * 10)
    with pytest.raises(ModelFileError) as e:
        load(str(p))
    assert "bad.onnx" in str(e.value)


def test_text_file_is_not_a_model(onnx_host, tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("hello world\n")
    with pytest.raises(ModelFileError, match="notes.onnx"):
        load(str(p))


def test_truncated_model(onnx_host, tmp_path):
    data = onnx.load(os.path.join(LIGHT_DIR, "light_squeezenet.onnx")).SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="cut.onnx"):
        load(str(p))


@pytest.mark.parametrize("kind", ["missing", "dir", "empty"])
def test_missing_dir_empty(onnx_host, tmp_path, kind):
    p = tmp_path / "m.onnx"
    if kind == "dir":
        p.mkdir()
    elif kind == "empty":
        p.write_bytes(b"")
    with pytest.raises(ModelFileError, match="m.onnx"):
        load(str(p))


def test_garbage_bytes(onnx_host):
    with pytest.raises(ModelFileError):
        load(b"\x00garbage\xff" * 3)


def test_undefined_input_name(onnx_host):
    m = _model([helper.make_node("Relu", ["nope"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ModelFileError, match="nope"):
        load(m)


# ------------------------------------------------------------------------------------------
# external data
# ------------------------------------------------------------------------------------------
def test_external_data_roundtrip(onnx_host, tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((32,)).astype(np.float32)
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
        [_vi("x", [1, 64])],
        [_vi("y", [1, 32])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    g = load(str(path))
    np.testing.assert_array_equal(g.constants["w"].const_value, w)
    np.testing.assert_array_equal(g.constants["b"].const_value, b)


def _external_model(location, *, offset=None, length=None, shape=(4,)):
    t = TensorProto()
    t.name = "w"
    t.data_type = TensorProto.FLOAT
    t.dims.extend(shape)
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    if offset is not None:
        entries["offset"] = str(offset)
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", list(shape))], [_vi("y", list(shape))], [t])


def _write(tmp_path, model, name="m.onnx"):
    d = tmp_path / "model_dir"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_bytes(model.SerializeToString())
    return d, p


def test_external_relative_subdir_ok(onnx_host, tmp_path):
    d, p = _write(tmp_path, _external_model("sub/../data.bin"))
    (d / "data.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    g = load(str(p))
    np.testing.assert_array_equal(g.constants["w"].const_value, np.arange(4, dtype=np.float32))


def test_external_parent_escape_refused(onnx_host, tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0" * 16)
    _, p = _write(tmp_path, _external_model("../x.bin"))
    with pytest.raises(SecurityError) as e:
        load(str(p))
    assert "'w'" in str(e.value) and "../x.bin" in str(e.value)


def test_external_absolute_refused(onnx_host, tmp_path):
    target = tmp_path / "abs.bin"
    target.write_bytes(b"\0" * 16)
    _, p = _write(tmp_path, _external_model(str(target)))
    with pytest.raises(SecurityError, match="absolute"):
        load(str(p))


def test_external_symlink_outside_refused(onnx_host, tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 16)
    d, p = _write(tmp_path, _external_model("link.bin"))
    os.symlink(outside, d / "link.bin")
    with pytest.raises(SecurityError, match="link.bin"):
        load(str(p))


def test_external_missing_file(onnx_host, tmp_path):
    _, p = _write(tmp_path, _external_model("gone.bin"))
    with pytest.raises(ModelFileError, match="gone.bin"):
        load(str(p))


@pytest.mark.parametrize("offset,length", [(8, 16), (0, 8), (0, 1 << 40)])
def test_external_bad_offset_length(onnx_host, tmp_path, offset, length):
    d, p = _write(tmp_path, _external_model("data.bin", offset=offset, length=length))
    (d / "data.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelFileError):
        load(str(p))


def test_external_huge_dims_refused_before_allocation(onnx_host, tmp_path):
    d, p = _write(tmp_path, _external_model("data.bin", shape=(1 << 20, 1 << 20, 1 << 10)))
    (d / "data.bin").write_bytes(b"\0" * 16)
    with pytest.raises((ModelFileError, SecurityError)):
        load(str(p))


def test_external_from_modelproto_needs_path(onnx_host):
    with pytest.raises(ModelFileError, match="external"):
        load(_external_model("data.bin"))


# ------------------------------------------------------------------------------------------
# ops
# ------------------------------------------------------------------------------------------
def test_unknown_ops_listed_in_one_error(onnx_host):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("MyOp", ["a"], ["b"], name="custom_node", domain="com.example"),
        helper.make_node("Rleu", ["b"], ["y"], name="typo_node"),
    ]
    m = helper.make_model(
        helper.make_graph(nodes, "g", [_vi("x", [2])], [_vi("y", [2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnsupportedOpError) as e:
        load(m)
    msg = str(e.value)
    for word in ("MyOp", "com.example", "custom_node", "Rleu", "typo_node", "ai.onnx", "Relu"):
        assert word in msg


def test_unknown_op_inside_subgraph(onnx_host):
    then_g = helper.make_graph([helper.make_node("Bogus", ["x"], ["t"], name="inner")], "then", [], [_vi("t", [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [2])])
    m = _model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        [_vi("c", [], TensorProto.BOOL), _vi("x", [2])],
        [_vi("y", [2])],
    )
    with pytest.raises(UnsupportedOpError, match="inner"):
        load(m)


def test_op_newer_than_opset(onnx_host):
    m = _model([helper.make_node("Gelu", ["x"], ["y"], name="g")], [_vi("x", [2])], [_vi("y", [2])], opset=13)
    with pytest.raises(UnsupportedOpError, match="opset"):
        load(m)


# ------------------------------------------------------------------------------------------
# attributes, names, subgraphs
# ------------------------------------------------------------------------------------------
def test_attribute_conversion(onnx_host):
    value = numpy_helper.from_array(np.array([1.5, 2.5], dtype=np.float32))
    nodes = [
        helper.make_node("Constant", [], ["c"], value=value, name="const"),
        helper.make_node("LeakyRelu", ["x"], ["l"], alpha=0.1),
        helper.make_node("Transpose", ["l"], ["t"], perm=[1, 0]),
        helper.make_node("Resize", ["t", "", "sc"], ["r"], mode="nearest"),
        helper.make_node("Add", ["r", "c"], ["y"]),
    ]
    sc = numpy_helper.from_array(np.array([1.0, 1.0], dtype=np.float32), "sc")
    m = _model(nodes, [_vi("x", [2, 2])], [_vi("y", [2, 2])], [sc])
    g = load(m)
    by = {n.op_type: n for n in g.nodes}
    assert isinstance(by["Constant"].attrs["value"], np.ndarray)
    np.testing.assert_array_equal(by["Constant"].attrs["value"], [1.5, 2.5])
    assert by["LeakyRelu"].attrs["alpha"] == 0.1
    assert by["Transpose"].attrs["perm"] == [1, 0]
    assert by["Resize"].attrs["mode"] == "nearest"
    assert by["Resize"].inputs[1] is None


def test_empty_and_duplicate_node_names(onnx_host):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="n"), helper.make_node("Relu", ["a"], ["b"], name="n"),
             helper.make_node("Relu", ["b"], ["y"])]
    g = load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    names = [n.name for n in g.nodes]
    assert len(set(names)) == 3 and names[0] == "n" and all(names)


def test_unsorted_nodes_are_ordered(onnx_host):
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="second"), helper.make_node("Neg", ["x"], ["a"], name="first")]
    g = load(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    assert [n.name for n in g.nodes] == ["first", "second"]
    g.verify()


def test_if_subgraphs_with_outer_reads_and_same_names(onnx_host):
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "else", [], [_vi("t", [2])])
    m = _model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if")],
        [_vi("c", [], TensorProto.BOOL), _vi("x", [2])],
        [_vi("y", [2])],
    )
    onnx.checker.check_model(m)
    g = load(m)
    (node,) = g.nodes
    tg, eg = node.attrs["then_branch"], node.attrs["else_branch"]
    assert isinstance(tg, Graph) and isinstance(eg, Graph)
    assert tg.parent is g and eg.parent is g
    x = g.inputs[1]
    assert next(iter(tg.nodes)).inputs[0] is x and next(iter(eg.nodes)).inputs[0] is x
    assert tg.outputs[0].name != eg.outputs[0].name  # renamed apart, positional anyway


def test_weights_listed_as_inputs_are_constants_before_ir4(onnx_host):
    # IR < 4 lists every weight as a graph input; those are constants, not inputs
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [3]), _vi("w", [3])], [_vi("y", [3])], [w],
               opset=8, ir_version=3)
    g = load(m)
    assert [v.name for v in g.inputs] == ["x"]
    assert "w" in g.constants


def test_initializer_listed_as_input_is_an_input_with_a_default_from_ir4(onnx_host):
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [3]), _vi("w", ["n"])], [_vi("y", [3])], [w])
    g = load(m)
    assert [v.name for v in g.inputs] == ["x", "w"] and "w" not in g.constants
    w_in = g.inputs[1]
    assert g.inputs[0].default is None
    np.testing.assert_array_equal(w_in.default, np.ones(3, np.float32))
    assert str(w_in.type) == str(_frontend_type("float32", ("n",)))  # the declared type, symbolic dim kept
    g.verify()
    np.testing.assert_array_equal(g.copy().inputs[1].default, w_in.default)


def test_initializer_that_does_not_fit_its_input_declaration_is_refused(onnx_host):
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [3]), _vi("w", [4])], [_vi("y", [3])], [w])
    with pytest.raises(ModelFileError, match="'w' is declared"):
        load(m)


def test_string_and_sparse_initializers(onnx_host):
    s = numpy_helper.from_array(np.array(["a", "bc"], dtype=object), "s")
    vals = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "sp")
    idx = numpy_helper.from_array(np.array([1, 3], np.int64), "sp_idx")
    sp = helper.make_sparse_tensor(vals, idx, [4])
    g = helper.make_graph([helper.make_node("Identity", ["s"], ["y"]), helper.make_node("Relu", ["sp"], ["z"])], "g",
                          [], [_vi("y", [2], TensorProto.STRING), _vi("z", [4])], initializer=[s],
                          sparse_initializer=[sp])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    gr = load(m)
    assert list(gr.constants["s"].const_value) == ["a", "bc"]
    np.testing.assert_array_equal(gr.constants["sp"].const_value, [0, 5, 0, 7])


def test_model_local_functions_are_inlined(onnx_host):
    fn = helper.make_function(
        "com.me", "AddRelu", ["a", "b"], ["c"],
        [helper.make_node("Add", ["a", "b"], ["t"]), helper.make_node("Relu", ["t"], ["c"])],
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m = helper.make_model(
        helper.make_graph([helper.make_node("AddRelu", ["x", "y"], ["z"], domain="com.me")], "g",
                          [_vi("x", [2]), _vi("y", [2])], [_vi("z", [2])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.me", 1)],
        functions=[fn],
    )
    before = m.SerializeToString()
    g = load(m)
    assert [n.op_type for n in g.nodes] == ["Add", "Relu"]
    assert g.metadata["inlined_functions"] == ["com.me::AddRelu"]
    assert m.SerializeToString() == before


# ------------------------------------------------------------------------------------------
# options
# ------------------------------------------------------------------------------------------
def test_input_shape_option(onnx_host):
    g = load(_add_model(), input_shape={"x": (2, 3)})
    assert g.inputs[0].type.shape == (2, 3)
    g = load(_add_model(), input_shape="x:-1,3")
    assert g.inputs[0].type.shape == ("N", 3)  # -1 keeps the dim dynamic, under the model's own name
    g = load(_add_model(), input_shape="x:1~8,3")
    assert g.inputs[0].type.shape == ("N", 3)  # a range too: the compiler gives the symbol its range


def test_input_shape_unknown_name(onnx_host):
    with pytest.raises(OptionError) as e:
        load(_add_model(), input_shape={"xx": (2, 3)})
    assert "xx" in str(e.value) and "x" in str(e.value)


def test_out_nodes_option(onnx_host):
    g = load(_add_model(), out_nodes=["s"])
    assert [v.name for v in g.outputs] == ["s"]
    g = load(_add_model(), out_nodes=["add:0", "y"])
    assert [v.name for v in g.outputs] == ["s", "y"]


def test_out_nodes_unknown(onnx_host):
    with pytest.raises(OptionError) as e:
        load(_add_model(), out_nodes=["relu_x"])
    assert "relu_x" in str(e.value) and "did you mean" in str(e.value)
    with pytest.raises(OptionError):
        load(_add_model(), out_nodes=["add:3"])


def test_errors_are_ge_errors(onnx_host, tmp_path):
    with pytest.raises(GEError):
        load(12345)


def test_input_shape_cannot_change_a_static_dim_or_the_rank(onnx_host):
    with pytest.raises(OptionError, match="fixes it to 3"):
        load(_add_model(), input_shape="x:2,4")  # the model's x is [N, 3]
    with pytest.raises(OptionError, match="rank"):
        load(_add_model(), input_shape="x:2,3,1")
