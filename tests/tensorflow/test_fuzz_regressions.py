"""Regressions found by fuzzing the TensorFlow frontend (tests/fuzz, target ``tensorflow``).

One test per root cause; each reproducer is a GraphDef built by hand (or a tf.function) and
written to a .pb. Several of them used to kill the process inside TensorFlow (a CHECK failure,
a segfault, an allocation of terabytes), so every model is loaded in one child process, under an
address-space cap like the fuzzer's: a regression fails its test, it does not take pytest down.
The child reports, per model, the result of ``ge.load`` (the error class, message and hint, or
the inputs of the graph).

Before the fixes (TensorFlow 2.21, the same cases):

* an output index of 2**31 or more in an input reference: segfault in TensorFlow's importer;
* a Const whose value's dtype differs from its ``dtype`` attribute: CHECK failure in a shape
  function or in grappler (``dtype() == expected_dtype``);
* a Const claiming a huge shape with one value: MemoryError behind a ModelFileError, or a
  segfault in grappler;
* a TensorProto whose values or bytes disagree with its shape, or of an invalid dtype: a
  ValueError of ``tf.make_ndarray`` behind "cannot convert";
* an attribute TensorFlow keeps unchecked (not in the op's definition) that the mapper cannot
  decode (``Tout`` = DT_INVALID on a MatMul): a TypeError behind "cannot convert";
* a Fill of a huge constant shape: grappler hangs (40 s of allocator retries) or aborts
  (``0 <= new_num_elements``);
* a constant shape operand whose dims overflow int64, or of rank > 254: CHECK failure in
  TensorFlow's shape inference while importing;
* a library function whose body is invalid: CHECK failure in grappler, or a KeyError /
  ValueError behind "cannot convert";
* a While/If whose call does not match its function's signature: ValueError / IndexError
  behind "cannot convert";
* a Range of constants 2**31 long (reduction axes): TensorFlow's shape inference evaluates it
  while importing (a hang under the fuzzer's cap; 18 GiB kept by the process without one);
* a GatherV2 whose ``batch_dims`` exceeds its operands' ranks: CHECK failure in its shape
  function (``rank must not be negative``);
* a valid Conv2D -> RealDiv by a constant vector -> Mul by a constant vector: CHECK failure in
  grappler's MulConvPushDown (``size >= 0``);
* a valid input of a large static shape: grappler allocates a tensor that size (segfault);
* a bfloat16 constant (the fuzzer got one through a Const of mismatching dtype): the .om writer
  raised ValueError (a memoryview cannot export ml_dtypes arrays; fixed in ge_core/serialize.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ge_core as ge

tf = pytest.importorskip("tensorflow")

from tensorflow.core.framework import graph_pb2, tensor_pb2, types_pb2  # noqa: E402

F32, I32 = types_pb2.DT_FLOAT, types_pb2.DT_INT32

# ------------------------------------------------------------------------------------------------
# building GraphDefs by hand
# ------------------------------------------------------------------------------------------------


def _node(gd, name: str, op: str, inputs=(), **attrs):
    n = gd.node.add()
    n.name, n.op = name, op
    n.input.extend(inputs)
    for key, v in attrs.items():
        a = n.attr[key]
        if isinstance(v, bool):
            a.b = v
        elif isinstance(v, int):
            a.i = v
        elif isinstance(v, str):
            a.s = v.encode()
        elif isinstance(v, tuple) and v and v[0] == "type":
            a.type = v[1]
        elif isinstance(v, tuple) and v and v[0] == "shape":
            for d in v[1]:
                a.shape.dim.add().size = d
        elif isinstance(v, tensor_pb2.TensorProto):
            a.tensor.CopyFrom(v)
        else:
            raise TypeError(key)
    return n


def _const(gd, name: str, value, dtype=None):
    t = tf.make_tensor_proto(np.asarray(value, dtype))
    return _node(gd, name, "Const", dtype=("type", t.dtype), value=t)


def _placeholder(gd, name: str, shape, dtype=F32):
    return _node(gd, name, "Placeholder", dtype=("type", dtype), shape=("shape", shape))


def _frozen(fn) -> graph_pb2.GraphDef:
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    return convert_variables_to_constants_v2(fn.get_concrete_function(), lower_control_flow=False).graph.as_graph_def()


def _output_index_beyond_int32():
    gd = graph_pb2.GraphDef()
    _placeholder(gd, "x", [2])
    _const(gd, "c", [1.0, 2.0], np.float32)
    _node(gd, "y", "AddV2", ["x", "c:2147483648"], T=("type", F32))  # TensorFlow wraps it to -2**31
    return gd


def _const_dtype_mismatch():
    gd = graph_pb2.GraphDef()
    _placeholder(gd, "x", [4])
    for name, v in (("begin", 1), ("end", 3), ("strides", 1)):
        n = _const(gd, name, [v], np.int32)
        if name == "begin":  # declares int32, holds qint8: the shape function reads it as int32
            t = n.attr["value"].tensor
            t.Clear()
            t.dtype = types_pb2.DT_QINT8
            t.tensor_shape.dim.add().size = 1
            t.int_val.append(1)
    _node(gd, "y", "StridedSlice", ["x", "begin", "end", "strides"], T=("type", F32), Index=("type", I32))
    return gd


def _huge_splat(dims, dtype=F32):
    def build():
        gd = graph_pb2.GraphDef()
        t = tensor_pb2.TensorProto(dtype=dtype)
        for d in dims:
            t.tensor_shape.dim.add().size = d
        (t.float_val if dtype == F32 else t.int_val).append(1)
        _node(gd, "big", "Const", dtype=("type", dtype), value=t)
        _node(gd, "y", "Identity", ["big"], T=("type", dtype))
        return gd

    return build


def _bad_tensor(kind: str):
    def build():
        gd = graph_pb2.GraphDef()
        _placeholder(gd, "x", [2])
        n = _const(gd, "c", [1.0, 2.0], np.float32)
        t = n.attr["value"].tensor
        if kind == "values":  # three values for two elements
            t.ClearField("tensor_content")
            t.float_val.extend([1.0, 2.0, 3.0])
        elif kind == "bytes":  # 7 bytes for two float32
            t.tensor_content = b"\0" * 7
        else:  # a reference DataType, which no tensor has
            t.dtype = 124
        _node(gd, "y", "AddV2", ["x", "c"], T=("type", F32))
        return gd

    return build


def _unreadable_attr():
    gd = graph_pb2.GraphDef()
    _placeholder(gd, "x", [2, 2])
    _const(gd, "w", np.eye(2, dtype=np.float32))
    n = _node(gd, "y", "MatMul", ["x", "w"], T=("type", F32))
    n.attr["Tout"].type = types_pb2.DT_INVALID  # not MatMul's attribute: TensorFlow keeps it unchecked
    return gd


def _huge_fill(dims, packed: bool = False):
    def build():
        gd = graph_pb2.GraphDef()
        if packed:  # computed dims: TensorFlow's shape inference folds them, the frontend sees the shape
            for i, d in enumerate(dims):
                _const(gd, f"d{i}", d, np.int32)
            _node(gd, "dims", "Pack", [f"d{i}" for i in range(len(dims))], T=("type", I32), N=len(dims), axis=0)
        else:
            _const(gd, "dims", dims, np.int32)
        _const(gd, "one", 1.0, np.float32)
        _node(gd, "fill", "Fill", ["dims", "one"], T=("type", F32), index_type=("type", I32))
        _node(gd, "y", "Sum", ["fill", "axes"], T=("type", F32), Tidx=("type", I32), keep_dims=False)
        _const(gd, "axes", list(range(len(dims))), np.int32)
        return gd

    return build


def _shape_operand(values):
    def build():
        gd = graph_pb2.GraphDef()
        _placeholder(gd, "x", [-1])
        _const(gd, "shape", values, np.int32)
        _node(gd, "r", "Reshape", ["x", "shape"], T=("type", F32), Tshape=("type", I32))
        for name, v in (("b", 0), ("e", 1), ("s", 1)):
            _const(gd, name, [v], np.int32)
        _node(gd, "y", "StridedSlice", ["r", "b", "e", "s"], T=("type", F32), Index=("type", I32),
              shrink_axis_mask=1)
        return gd

    return build


def _huge_range():
    gd = graph_pb2.GraphDef()
    _placeholder(gd, "x", [2, 3])
    for name, v in (("start", 0), ("limit", 2**31 - 1), ("delta", 1)):
        _const(gd, name, v, np.int32)
    _node(gd, "r", "Range", ["start", "limit", "delta"], Tidx=("type", I32))  # what a Rank const became
    _node(gd, "y", "Max", ["x", "r"], T=("type", F32), Tidx=("type", I32), keep_dims=False)
    return gd


def _gather_batch_dims():
    gd = graph_pb2.GraphDef()
    _placeholder(gd, "x", [2, 6, 4])
    _const(gd, "indices", [3, 0], np.int32)
    _placeholder(gd, "axis", [], I32)  # not a constant: TensorFlow's shape function then trusts batch_dims
    _node(gd, "y", "GatherV2", ["x", "indices", "axis"], Tparams=("type", F32), Tindices=("type", I32),
          Taxis=("type", I32), batch_dims=8)
    return gd


@tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
def _cond_and_loop(x):
    y = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.nn.relu(x) * 2.0, lambda: x - 1.0)
    return tf.while_loop(lambda i, y: i < 4, lambda i, y: (i + 1, y * 0.5), (tf.constant(0), y))[1]


def _function_named(gd, prefix: str):
    return next(f for f in gd.library.function if f.signature.name.startswith(prefix))


def _invalid_body(kind: str):
    def build():
        gd = _frozen(_cond_and_loop)
        if kind == "missing_attr":  # the branch's Const without its value
            f = _function_named(gd, "cond_true")
            n = next(n for n in f.node_def if n.op == "Const")
            n.attr["val\0\0"].CopyFrom(n.attr["value"])
            del n.attr["value"]
        else:  # the condition returns a tensor that is not there
            f = _function_named(gd, "while_cond")
            key = next(iter(f.ret))
            f.ret[key] = "no_such_node:z:0"
        return gd

    return build


def _call_mismatch(kind: str):
    def build():
        gd = _frozen(_cond_and_loop)
        f = _function_named(gd, "while_cond")
        if kind == "arguments":  # the condition takes one argument more than the loop passes
            extra = f.signature.input_arg.add()
            extra.name, extra.type = "extra_arg", F32
        else:  # the condition returns nothing
            del f.signature.output_arg[:]
        return gd

    return build


def _conv_div_mul():
    w = tf.constant(np.random.default_rng(0).standard_normal((3, 3, 3, 4)).astype(np.float32))
    scale = tf.constant(np.arange(1, 5, dtype=np.float32))
    gamma = tf.constant(np.arange(2, 6, dtype=np.float32))

    @tf.function(input_signature=[tf.TensorSpec((1, 8, 8, 3), tf.float32, name="x")])
    def f(x):
        y = tf.nn.conv2d(x, w, 1, "SAME") / scale
        return y * (tf.math.rsqrt(gamma + 1e-3) * gamma)

    return f


def _big_static_input():
    gd = graph_pb2.GraphDef()
    _placeholder(gd, "x", [2_000_000_000, 3])
    _const(gd, "axes", [0, 1], np.int32)
    _node(gd, "y", "Sum", ["x", "axes"], T=("type", F32), Tidx=("type", I32), keep_dims=False)
    return gd


CASES = {
    "output_index": _output_index_beyond_int32,
    "const_dtype": _const_dtype_mismatch,
    "splat_4tib": _huge_splat([2**40]),
    "splat_overflow": _huge_splat([2**31, 2**31], I32),
    "splat_zero_dim": _huge_splat([0, 2**62], I32),  # a zero dim must not hide the other
    "tensor_values": _bad_tensor("values"),
    "tensor_bytes": _bad_tensor("bytes"),
    "tensor_dtype": _bad_tensor("dtype"),
    "attr_unreadable": _unreadable_attr,
    "fill_128gib": _huge_fill([32768, 1048576]),
    "fill_overflow": _huge_fill([2**20, 2**20, 2**20]),
    "fill_packed": _huge_fill([2**20, 2**20, 2**20], packed=True),
    "shape_overflow": _shape_operand([2**31 - 1, 2**31 - 1, 7]),
    "shape_rank": _shape_operand([1] * 300),
    "range_8gib": _huge_range,
    "gather_batch_dims": _gather_batch_dims,
    "body_missing_attr": _invalid_body("missing_attr"),
    "body_bad_ret": _invalid_body("ret"),
    "call_arguments": _call_mismatch("arguments"),
    "call_no_outputs": _call_mismatch("outputs"),
    "conv_div_mul": lambda: _frozen(_conv_div_mul()),
    "big_static_input": _big_static_input,
}

# ------------------------------------------------------------------------------------------------
# loading every case in one capped child
# ------------------------------------------------------------------------------------------------
CHILD = r"""
import json, os, resource, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import ge_core as ge
import tensorflow as tf

@tf.function(input_signature=[tf.TensorSpec((2,), tf.float32, name="x")])
def warm(x):
    return x + 1.0

ge.load(warm)  # TensorFlow and the plugins set up before the cap
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), vm + (3 << 30)))
for case, path in json.loads(sys.argv[1]):
    print(json.dumps({"id": case, "started": True}), flush=True)
    try:
        g = ge.load(path)
        out = {"ok": True, "inputs": {v.name: list(v.type.shape or ()) for v in g.inputs}}
    except ge.GEError as e:
        cause = e.__cause__
        out = {"ok": False, "error": type(e).__name__, "message": str(e), "hint": e.hint,
               "cause": type(cause).__name__ if cause is not None else None}
    except BaseException as e:
        out = {"ok": False, "error": type(e).__name__, "message": str(e), "hint": None, "cause": None}
    out["id"] = case
    print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """case id -> what ``ge.load`` of its .pb did in the child (``died`` if it killed the child)."""
    folder = tmp_path_factory.mktemp("tf_fuzz_regressions")
    paths = []
    for case, build in CASES.items():
        p = folder / f"{case}.pb"
        p.write_bytes(build().SerializeToString())
        paths.append((case, str(p)))
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(paths)], capture_output=True, text=True,
                          timeout=600, env=env)
    results: dict[str, dict] = {}
    running = None
    for line in proc.stdout.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("started"):
            running = r["id"]
        else:
            results[r["id"]] = r
            running = None
    if running is not None:
        results[running] = {"died": proc.returncode, "stderr": proc.stderr[-3000:]}
    return {"paths": dict(paths), "results": results}


def _result(loaded, case: str) -> dict:
    r = loaded["results"].get(case)
    assert r is not None, f"{case}: not run (an earlier case killed the child)"
    assert "died" not in r, f"{case} killed the process (status {r['died']}):\n{r['stderr']}"
    return r


def _refused(loaded, case: str, *needles: str) -> str:
    """The case ends in a clean ModelFileError naming the file, the culprit and what to do."""
    r = _result(loaded, case)
    assert not r["ok"], f"{case} loaded"
    assert r["error"] == "ModelFileError", r
    assert r["cause"] is None, f"{case}: a ModelFileError wrapping {r['cause']}: {r['message']}"
    msg = r["message"]
    assert loaded["paths"][case] in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert r["hint"], msg
    return msg


def test_output_index_beyond_int32(loaded):
    _refused(loaded, "output_index", "node 'y' (AddV2)", "'c:2147483648'", "out of range")


def test_const_value_dtype_differs_from_dtype_attr(loaded):
    _refused(loaded, "const_dtype", "node 'begin' (Const)", "DT_QINT8", "DT_INT32")


@pytest.mark.parametrize("case,shape", [("splat_4tib", "[1099511627776]"), ("splat_overflow", "[2147483648, 2147483648]"),
                                        ("splat_zero_dim", "[0, 4611686018427387904]")])
def test_const_claiming_a_huge_shape(loaded, case, shape):
    _refused(loaded, case, "node 'big' (Const)", shape, "bytes a constant may have")


@pytest.mark.parametrize("case,needle", [("tensor_values", "holds 3 values"), ("tensor_bytes", "holds 7 bytes"),
                                         ("tensor_dtype", "invalid dtype")])
def test_tensor_that_disagrees_with_its_shape_or_dtype(loaded, case, needle):
    _refused(loaded, case, "node 'c' (Const)", "attribute 'value'", needle)


def test_attribute_the_mapper_cannot_read(loaded):
    _refused(loaded, "attr_unreadable", "TensorFlow node 'y' (MatMul)", "unreadable attribute 'Tout'")


@pytest.mark.parametrize("case,needle", [("fill_128gib", "from constants only"),
                                         ("fill_overflow", "more than 1099511627776 elements"),
                                         ("fill_packed", "memory arena")])
def test_fill_of_a_huge_constant_shape(loaded, case, needle):
    _refused(loaded, case, "node 'fill' (Fill)", needle)


@pytest.mark.parametrize("case,needle", [("shape_overflow", "more than 1099511627776 elements"),
                                         ("shape_rank", "rank 300")])
def test_constant_shape_operand_out_of_range(loaded, case, needle):
    _refused(loaded, case, "node 'r' (Reshape)", "'shape'", "constant 'shape'", needle)


def test_range_of_constants_too_long(loaded):
    _refused(loaded, "range_8gib", "node 'r' (Range)", "2147483647 elements from constants only")


def test_gather_batch_dims_beyond_the_ranks(loaded):
    r = _result(loaded, "gather_batch_dims")
    assert not r["ok"] and r["error"] == "UnsupportedOpError", r
    msg = r["message"]
    assert loaded["paths"]["gather_batch_dims"] in msg and "TensorFlow node 'y' (GatherV2)" in msg, msg
    assert "batch_dims=8" in msg and r["hint"], msg


@pytest.mark.parametrize("case,needle", [("body_missing_attr", "missing attr 'value'"),
                                         ("body_bad_ret", "no_such_node")])
def test_invalid_function_body(loaded, case, needle):
    msg = _refused(loaded, case, "of the graph's library is invalid", needle)
    assert "function '" in msg


@pytest.mark.parametrize("case,needle", [("call_arguments", "it takes 5"), ("call_no_outputs", "returns 0")])
def test_loop_call_that_does_not_match_the_function(loaded, case, needle):
    _refused(loaded, case, "TensorFlow node 'while' (StatelessWhile)", "calls function 'while_cond", needle)


def test_conv_divided_and_multiplied_by_constant_vectors(loaded):
    """A valid model that grappler's MulConvPushDown used to abort on."""
    r = _result(loaded, "conv_div_mul")
    assert r["ok"], r
    f = _conv_div_mul()
    model = ge.compile(loaded["paths"]["conv_div_mul"])
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 3)).astype(np.float32)
    (y,) = model.run({"x": x}).values()
    np.testing.assert_allclose(y, f(x).numpy(), rtol=1e-4, atol=1e-4)


def test_large_static_input_is_not_allocated_while_loading(loaded):
    r = _result(loaded, "big_static_input")
    assert r["ok"], r
    assert r["inputs"] == {"x": [2_000_000_000, 3]}


def test_bfloat16_constant_compiles_and_saves(tmp_path):
    @tf.function(input_signature=[tf.TensorSpec((2,), tf.bfloat16, name="x")])
    def f(x):
        return x * tf.constant([2.0, 3.0], tf.bfloat16)

    ge.compile(f, {"framework": 3}).save(str(tmp_path / "bf16.om"))
    import ml_dtypes

    x = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    again = ge.load_om(str(tmp_path / "bf16.om"))
    got = again.run({"x": x})[again.output_names[0]]
    np.testing.assert_array_equal(got.astype(np.float32), f(tf.constant(x)).numpy().astype(np.float32))
