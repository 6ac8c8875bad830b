"""The TensorFlow target's seeds (small frozen GraphDefs), the op types, attribute names and
values its mutations draw from, and its edits of a node."""

from __future__ import annotations

import contextlib
import os
import random

from fuzz_common import _weird_float, _weird_int

#: TF op types that no mapper handles (or that only make sense in other graphs), for op swaps
TF_OTHER_OPS = ["MatrixDeterminant", "Lgamma", "Xdivy", "VarHandleOp", "ReadVariableOp", "VariableV2", "Assert",
                "Print", "PyFunc", "Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond",
                "PartitionedCall", "StatefulPartitionedCall", "SparseTensorDenseMatMul", "DecodeJpeg",
                "TensorArrayV3", "RandomUniform", "Unique", "NonMaxSuppressionV5", "Conv2DBackpropFilter",
                "FakeQuantWithMinMaxVars", "QuantizeV2", "StringToNumber", "Bitcast", "Placeholder", "Const",
                "NoOp", "", "NoSuchOp", "x" * 300]
#: attribute names the mappers (and TensorFlow's shape functions) read
TF_ATTR_NAMES = ["T", "dtype", "shape", "value", "strides", "padding", "data_format", "dilations", "ksize",
                 "explicit_paddings", "perm", "N", "Tidx", "Tshape", "Tpaddings", "axis", "num", "num_split",
                 "begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask", "keep_dims",
                 "squeeze_dims", "transpose_a", "transpose_b", "adj_x", "adj_y", "epsilon", "is_training",
                 "then_branch", "else_branch", "cond", "body", "Tcond", "Tin", "Tout", "output_shapes",
                 "parallel_iterations", "element_dtype", "element_shape", "num_elements", "out_type", "SrcT",
                 "DstT", "Truncate", "mode", "block_size", "depth_radius", "align_corners", "half_pixel_centers",
                 "batch_dims", "equation", "output_type", "exclusive", "reverse", "Index", "TI", "alpha", "zz"]
TF_STRINGS = [b"SAME", b"VALID", b"EXPLICIT", b"NHWC", b"NCHW", b"NDHWC", b"NCDHW", b"NHWC_VECT_W", b"REFLECT",
              b"SYMMETRIC", b"CONSTANT", b"", b"\xff\xfe", b"x" * 1000, b"ab,ab->a", b"...ij,jk", b"->"]
#: DataType enum values: the valid ones, reference types, DT_INVALID and unknown numbers
TF_DTYPES = list(range(0, 24)) + [101, 107, 120, 124, 200, 10000, 2**31 - 1]
#: the usual numeric DataTypes (float, double, int32, uint8, int16, int8, int64, bool, bfloat16, half)
TF_NUMERIC = [1, 1, 1, 2, 3, 3, 4, 5, 6, 9, 9, 10, 14, 17, 19]
#: op types of one signature class: a swap inside a class keeps the graph importable more often
TF_OP_GROUPS = [
    ["Relu", "Relu6", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Rsqrt", "Neg", "Abs", "Floor", "Ceil", "Round",
     "Sign", "Reciprocal", "Erf", "Sin", "Cos", "Elu", "Selu", "Softplus", "Softsign", "Square", "Expm1", "Log1p",
     "LeakyRelu", "Identity", "StopGradient", "Softmax", "LogSoftmax", "ZerosLike", "OnesLike", "IsNan",
     "Shape", "Size", "Rank"],
    ["Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum", "Pow", "FloorDiv",
     "FloorMod", "TruncateDiv", "SquaredDifference", "BiasAdd", "MatMul", "BatchMatMulV2", "Equal", "NotEqual",
     "Less", "Greater", "LessEqual", "GreaterEqual"],
    ["Mean", "Sum", "Max", "Min", "Prod", "ArgMax", "ArgMin", "ExpandDims", "Reshape", "Tile", "BroadcastTo",
     "Transpose", "Pad", "MirrorPad", "Squeeze", "Fill", "GatherV2", "ConcatV2", "Pack", "Split", "SplitV",
     "Cumsum", "OneHot", "TopKV2", "Range", "Slice", "StridedSlice"],
    ["Conv2D", "DepthwiseConv2dNative", "Conv3D", "Conv2DBackpropInput"],
    ["MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "SpaceToDepth", "DepthToSpace", "LRN", "ResizeBilinear",
     "ResizeNearestNeighbor"],
    ["FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"],
    ["StatelessIf", "If", "StatelessWhile", "While"],
    ["TensorListFromTensor", "TensorListReserve", "TensorListGetItem", "TensorListSetItem", "TensorListStack",
     "TensorListLength", "EmptyTensorList"],
]


def _tf_seeds() -> list[tuple[str, bytes]]:
    """(name, serialized frozen GraphDef) of every seed; built once per process."""
    global _TF_SEEDS
    if _TF_SEEDS is not None:
        return _TF_SEEDS
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    def frozen(cf) -> bytes:
        gd = convert_variables_to_constants_v2(cf, lower_control_flow=False).graph.as_graph_def()
        return gd.SerializeToString(deterministic=True)  # map fields (attr) in a stable order

    keras.utils.set_random_seed(0)
    seeds = []
    # a small Keras CNN: Conv2D, BatchNorm, ReLU, pooling, depthwise conv, Concatenate, Dense
    inp = keras.Input((8, 8, 3), batch_size=1, name="img")
    h = keras.layers.Conv2D(4, 3, padding="same")(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    a = keras.layers.Conv2D(2, 1, strides=2)(h)
    b = keras.layers.MaxPooling2D(2)(h)
    b = keras.layers.DepthwiseConv2D(3, padding="same")(b)
    h = keras.layers.Concatenate()([a, b])
    h = keras.layers.GlobalAveragePooling2D()(h)
    cnn = keras.Model(inp, keras.layers.Dense(5, activation="softmax")(h))
    fn = tf.function(lambda x: cnn(x, training=False))
    seeds.append(("keras_cnn", frozen(fn.get_concrete_function(tf.TensorSpec((1, 8, 8, 3), tf.float32, name="img")))))

    # tf.cond and tf.while_loop kept functional: StatelessIf / StatelessWhile with a function library
    @tf.function(input_signature=[tf.TensorSpec((2, 3), tf.float32, name="x")])
    def control(x):
        y = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.nn.relu(x) * 2.0, lambda: x - 1.0)
        i = tf.constant(0)
        return tf.while_loop(lambda i, y: i < 4, lambda i, y: (i + 1, y * 0.5 + tf.cast(i, tf.float32)), (i, y))[1]

    seeds.append(("control_flow", frozen(control.get_concrete_function())))

    # shape and data-movement ops
    @tf.function(input_signature=[tf.TensorSpec((2, 6, 4), tf.float32, name="x")])
    def shapes(x):
        a = x[:, 1:5:2, ::-1]
        b = x[..., tf.newaxis, 0]
        c = tf.concat([tf.reshape(a, [2, -1]), tf.reshape(b, [2, -1])], axis=1)
        e = tf.transpose(tf.pad(x, [[0, 0], [1, 2], [0, 1]]), [0, 2, 1])
        s1, s2 = tf.split(x, [2, 4], axis=1)
        g = tf.gather(x, [3, 0], axis=1)
        t = tf.tile(tf.expand_dims(tf.squeeze(x[:, :1, :], axis=1), -1), [1, 1, 2])
        return (tf.reduce_sum(c, axis=1) + tf.reduce_mean(e, axis=[1, 2]) + tf.reduce_max(s2, axis=[1, 2])
                + tf.reduce_sum(g, axis=[1, 2]) + tf.reduce_sum(s1 * 2.0, axis=[1, 2]) + tf.reduce_sum(t, axis=[1, 2]))

    seeds.append(("shapes", frozen(shapes.get_concrete_function())))

    # a GRU: a While loop over TensorLists
    inp = keras.Input((3, 2), batch_size=1, name="seq")
    rnn = keras.Model(inp, keras.layers.GRU(2)(inp))
    fn = tf.function(lambda x: rnn(x, training=False))
    seeds.append(("gru", frozen(fn.get_concrete_function(tf.TensorSpec((1, 3, 2), tf.float32, name="seq")))))
    _TF_SEEDS = seeds
    return seeds


_TF_SEEDS: list[tuple[str, bytes]] | None = None


class TfGraphMutations:
    """The structure-aware edits of :class:`target_tensorflow.TfTarget`: shapes, Const tensors,
    attributes (within their kind or not) and the values of small Consts."""

    def _weird_shape(self, sp, rng: random.Random) -> None:
        r = rng.random()
        if r < 0.15:
            sp.Clear()
            sp.unknown_rank = True
            return
        if r < 0.5 and len(sp.dim):
            sp.dim[rng.randrange(len(sp.dim))].size = _weird_int(rng) if rng.random() < 0.8 else -1
        elif r < 0.7:
            sp.dim.add().size = _weird_int(rng)
        elif r < 0.8 and len(sp.dim):
            del sp.dim[rng.randrange(len(sp.dim))]
        else:
            del sp.dim[:]
            for _ in range(rng.choice((0, 1, 2, 3, 4, 5, 9))):
                sp.dim.add().size = rng.choice([2**31, 2**40, 2**62, 2**63 - 1, -1, -2, 0, 1, 3])

    def _weird_tensor(self, t, rng: random.Random) -> str:
        """Mutate a TensorProto (a Const value or a tensor attribute) in place."""
        r = rng.random()
        if r < 0.2:
            t.dtype = rng.choice(TF_DTYPES)
            return "tdtype"
        if r < 0.45:
            self._weird_shape(t.tensor_shape, rng)
            return "tshape"
        if r < 0.6:
            c = t.tensor_content
            rr = rng.random()
            if rr < 0.4:
                t.tensor_content = c[: rng.randrange(len(c) + 1)]
            elif rr < 0.7:
                t.tensor_content = c + bytes(rng.randrange(256) for _ in range(rng.choice((1, 3, 4, 8, 64))))
            else:
                t.tensor_content = bytes(rng.randrange(256) for _ in range(len(c) or 16))
            return "tcontent"
        if r < 0.75:
            t.ClearField("tensor_content")
            rr = rng.random()
            if rr < 0.3:
                t.float_val.extend([_weird_float(rng) for _ in range(rng.randint(0, 5))])
            elif rr < 0.55:
                t.int_val.extend([_weird_int(rng) & 0x7FFFFFFF for _ in range(rng.randint(0, 5))])
            elif rr < 0.7:
                t.int64_val.extend([_weird_int(rng) for _ in range(rng.randint(0, 5))])
            elif rr < 0.8:
                t.bool_val.extend([True, False][: rng.randint(0, 2)])
            elif rr < 0.9:
                t.string_val.extend([b"\xff", b"ab", b""][: rng.randint(0, 3)])
            else:
                t.half_val.extend([0xFFFF, 1])
            return "tvals"
        # a huge shape, filled from one value (TensorFlow splats the last value)
        t.ClearField("tensor_content")
        del t.tensor_shape.dim[:]
        for _ in range(rng.randint(1, 4)):
            t.tensor_shape.dim.add().size = rng.choice([2**16, 2**20, 2**31, 2**40, 2**62])
        t.float_val.append(1.0)
        t.int_val.append(1)
        return "thuge"

    def _mutate_attr(self, n, rng: random.Random, funcs: list[str], tensors: list) -> str:
        keys = sorted(n.attr)  # (a map: its own order changes from one process to the next)
        if keys and rng.random() < 0.75:
            key = rng.choice(keys)
        else:
            key = rng.choice(TF_ATTR_NAMES)
        a = n.attr[key]
        if a.WhichOneof("value") and rng.random() < 0.6:
            return self._same_kind_attr(a, rng, funcs) + ":" + key
        r = rng.random()
        if r < 0.08:
            del n.attr[key]
            return f"del:{key}"
        if r < 0.2:
            a.type = rng.choice(TF_DTYPES)
        elif r < 0.32:
            self._weird_shape(a.shape, rng)
        elif r < 0.5:
            lst = [rng.choice([0, 1, 2, 3, -1, -2, 4, 5, 64]) if rng.random() < 0.7 else _weird_int(rng)
                   for _ in range(rng.choice((0, 1, 2, 3, 4, 4, 5, 8)))]
            a.list.Clear()
            a.list.i.extend(lst)
        elif r < 0.62:
            a.s = rng.choice(TF_STRINGS)
        elif r < 0.72:
            a.i = _weird_int(rng)
        elif r < 0.76:
            a.f = _weird_float(rng)
        elif r < 0.8:
            a.b = rng.random() < 0.5
        elif r < 0.86:
            a.func.name = rng.choice(funcs + ["missing_fn", "", "x" * 300])
        elif r < 0.92:
            if tensors:
                a.tensor.CopyFrom(rng.choice(tensors))
            if a.HasField("tensor"):
                self._weird_tensor(a.tensor, rng)
            else:
                a.tensor.dtype = rng.choice(TF_DTYPES)
        elif r < 0.96:
            a.list.Clear()
            a.list.type.extend(rng.choice(TF_DTYPES) for _ in range(rng.randint(0, 4)))
        else:
            a.list.Clear()
            for _ in range(rng.randint(0, 3)):
                self._weird_shape(a.list.shape.add(), rng)
        return key

    def _same_kind_attr(self, a, rng: random.Random, funcs: list[str]) -> str:
        """Change an attribute's value but not its kind (what TensorFlow's importer checks first)."""
        which = a.WhichOneof("value")
        small = [0, 1, 2, 3, 4, 5, 7, 8, -1, -2, -3, 64, 255]
        if which == "i":
            a.i = rng.choice(small) if rng.random() < 0.8 else _weird_int(rng)
        elif which == "f":
            a.f = rng.choice([0.0, 1e-3, 0.5, 1.0, 2.0, -1.0]) if rng.random() < 0.6 else _weird_float(rng)
        elif which == "b":
            a.b = not a.b
        elif which == "s":
            a.s = rng.choice(TF_STRINGS)
        elif which == "type":
            a.type = rng.choice(TF_NUMERIC)
        elif which == "shape":
            self._weird_shape(a.shape, rng)
        elif which == "func":
            a.func.name = rng.choice(funcs + ["missing_fn"])
        elif which == "tensor":
            self._weird_tensor(a.tensor, rng)
        elif which == "list":
            lst = a.list
            if len(lst.i):
                vals = list(lst.i)
                r = rng.random()
                if r < 0.4:
                    vals[rng.randrange(len(vals))] = rng.choice(small) if rng.random() < 0.8 else _weird_int(rng)
                elif r < 0.55:
                    vals.reverse()
                elif r < 0.7:
                    del vals[rng.randrange(len(vals))]
                elif r < 0.85:
                    vals.append(rng.choice(small))
                else:
                    rng.shuffle(vals)
                del lst.i[:]
                lst.i.extend(vals)
            elif len(lst.type):
                lst.type[rng.randrange(len(lst.type))] = rng.choice(TF_NUMERIC)
                if rng.random() < 0.3:
                    del lst.type[rng.randrange(len(lst.type))]
            elif len(lst.shape):
                self._weird_shape(lst.shape[rng.randrange(len(lst.shape))], rng)
            elif len(lst.s):
                lst.s[rng.randrange(len(lst.s))] = rng.choice(TF_STRINGS)
            else:
                lst.i.extend([rng.choice(small) for _ in range(rng.randint(1, 4))])
        return "same"

    def _mutate_value(self, n, rng: random.Random) -> str:
        """Edit the value of a small numeric Const, keeping its dtype: axes, perms, shapes, paddings,
        begin/end/strides, split sizes and the like reach the mappers."""
        import numpy as np
        from tensorflow.python.framework import tensor_util

        t = n.attr["value"].tensor
        try:
            arr = np.array(tensor_util.MakeNdarray(t))
        except Exception:  # noqa: BLE001 - mutated already into something unreadable
            return "value:unreadable"
        if arr.size > 64 or arr.dtype.kind not in "iuf":
            return "value:skip"
        flat = arr.reshape(-1).copy()
        r = rng.random()
        if r < 0.45 and flat.size:
            pool = [0, 1, 2, 3, -1, -2, 5, 100, -100, 2**31 - 1, -(2**31)] if flat.dtype.kind in "iu" else \
                [0.0, 1.0, -1.0, 1e30, float("nan"), float("inf")]
            v = rng.choice(pool)
            with contextlib.suppress(OverflowError, ValueError):
                flat[rng.randrange(flat.size)] = np.array(v).astype(flat.dtype)
            new = flat.reshape(arr.shape)
        elif r < 0.6:
            new = flat[::-1].reshape(arr.shape)
        elif r < 0.75:
            new = flat[:-1] if flat.size else flat  # one element fewer (a rank-1 shape)
        elif r < 0.9:
            new = np.concatenate([flat, flat[-1:] if flat.size else np.zeros(1, flat.dtype)])
        else:
            new = flat.reshape(arr.shape) if arr.ndim == 0 else flat.reshape(-1)[:0]
        t.CopyFrom(tensor_util.make_tensor_proto(np.asarray(new, dtype=arr.dtype)))
        return "value"
