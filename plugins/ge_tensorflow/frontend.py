"""The TensorFlow frontend (ATC ``--framework=3``).

Reads a frozen ``GraphDef`` (``.pb``), a SavedModel directory, a Keras model (``.keras``/``.h5``
file or object), a ``tf.function`` with an input signature, a ``ConcreteFunction`` or a
``GraphDef`` object. Variables are frozen into constants
(``convert_variables_to_constants_v2``, control flow kept functional so that ``If``/``While``
become ONNX ``If``/``Loop``), TensorFlow's grappler folds constant subgraphs, and every op the
requested outputs need is converted by the op mapper registered for it (see
:mod:`ge_tensorflow.convert`).

* inputs are the placeholders, named after them; ``input_shape`` fixes their shapes (before
  TensorFlow's shape inference runs, so that shape computations fold);
* outputs are the function's outputs (a SavedModel signature's output keys) or ``out_nodes``
  (``node``, ``node:index`` or tensor names);
* NHWC ops are converted as NCHW ONNX ops between Transposes (passes cancel adjacent pairs);
* unknown ops raise one :class:`UnsupportedOpError` listing them all;
* TensorFlow is imported only here, when a model is loaded.
"""

from __future__ import annotations

import os
from typing import Any

from ge_core.errors import GEError, ModelFileError, OptionError
from ge_core.frontend import Frontend
from ge_core.ir.graph import Graph
from ge_core.ir.types import TensorType
from ge_core.registry import close_matches
from ge_sdk.shapes import check_dims

#: The ONNX opset the emitted IR follows.
OPSET = 18

_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def _import_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ModelFileError(
            f"reading a TensorFlow model needs the tensorflow package ({e})",
            hint="pip install 'ge-python[tensorflow]'",
        ) from None
    return tf


def _is_saved_model_dir(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in _SAVED_MODEL_FILES)


class _Source:
    """What the loaders produce: a frozen GraphDef plus its interface."""

    def __init__(self, graph_def, inputs: list[str], outputs: list[str], output_names: list[str], name: str) -> None:
        self.graph_def = graph_def
        self.inputs = inputs  # placeholder op names
        self.outputs = outputs  # tensor names
        self.output_names = output_names
        self.name = name
        #: what must outlive the frozen graph (the loaded SavedModel)
        self.keep: Any = None


# ------------------------------------------------------------------------------------------
# loaders
# ------------------------------------------------------------------------------------------
def _freeze(func, name: str, output_keys: list[str] | None = None) -> _Source:
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    try:
        frozen = convert_variables_to_constants_v2(func, lower_control_flow=False)
    except GEError:
        raise
    except Exception as e:
        raise ModelFileError(f"cannot freeze the variables of {name}: {type(e).__name__}: {e}") from None
    gd = frozen.graph.as_graph_def()
    inputs = [t.op.name for t in frozen.inputs if t.dtype.name != "resource"]
    outputs = [t.name for t in frozen.outputs]
    names = list(output_keys) if output_keys and len(output_keys) == len(outputs) else [_strip(t) for t in outputs]
    return _Source(gd, inputs, outputs, names, name)


def _strip(tensor_name: str) -> str:
    return tensor_name[:-2] if tensor_name.endswith(":0") else tensor_name


def _load_saved_model(path: str, options) -> _Source:
    from .safety import check_saved_model

    tf = _import_tf()
    check_saved_model(path)  # contained in its folder, no op that touches files or runs Python
    try:
        loaded = tf.saved_model.load(path)
    except Exception as e:
        raise ModelFileError(
            f"cannot load the SavedModel '{path}': {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            hint="check that the directory is a complete SavedModel (saved_model.pb and variables/)",
        ) from None
    sigs = dict(getattr(loaded, "signatures", {}) or {})
    if not sigs:
        raise ModelFileError(f"SavedModel '{path}' has no signatures", hint="save it with a serving signature")
    want = options_extra(options, "signature") or ("serving_default" if "serving_default" in sigs else sorted(sigs)[0])
    if want not in sigs:
        raise OptionError(f"SavedModel '{path}' has no signature '{want}'{close_matches(want, sigs)}",
                          hint=f"signatures: {', '.join(sorted(sigs))}")
    func = sigs[want]
    keys = None
    so = getattr(func, "structured_outputs", None)
    if isinstance(so, dict):
        keys = sorted(so)
    src = _freeze(func, path, keys)
    src.keep = loaded
    return src


def options_extra(options, key: str) -> Any:
    return options.getoption(key)


def _load_graph_def_file(path: str) -> _Source:
    tf = _import_tf()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelFileError(f"cannot read model file '{path}': {e.strerror or e}") from None
    if not data:
        raise ModelFileError(f"model file '{path}' is empty", hint="re-export the frozen graph")
    gd = tf.compat.v1.GraphDef()
    try:
        gd.ParseFromString(data)
    except Exception as e:
        gd = None
        if path.endswith(".pbtxt"):
            from google.protobuf import text_format

            try:
                gd = text_format.Parse(data.decode("utf-8"), tf.compat.v1.GraphDef())
            except Exception:
                gd = None
        if gd is None:
            raise ModelFileError(
                f"'{path}' is not a valid TensorFlow GraphDef (protobuf parse failed: {type(e).__name__})",
                hint="give a frozen GraphDef .pb, a SavedModel directory or a Keras model",
            ) from None
    if not gd.node or any(not n.op for n in gd.node):
        raise ModelFileError(
            f"'{path}' does not look like a TensorFlow GraphDef (no nodes, or nodes without ops)",
            hint="give a frozen GraphDef .pb, a SavedModel directory or a Keras model",
        )
    return _graph_def_source(gd, path)


def _graph_def_source(gd, name: str) -> _Source:
    consumed = set()
    for n in gd.node:
        for i in n.input:
            consumed.add(i.lstrip("^").split(":")[0])
    inputs = [n.name for n in gd.node if n.op == "Placeholder"]
    outputs = []
    for n in gd.node:
        if n.name in consumed or n.op in ("NoOp", "Const", "Placeholder", "Assert", "SaveV2", "RestoreV2"):
            continue
        outputs.append(f"{n.name}:0")
    if not outputs:
        raise ModelFileError(f"{name}: cannot tell the outputs of the graph", hint="give them with out_nodes")
    return _Source(gd, inputs, outputs, [_strip(o) for o in outputs], name)


def _keras_function(model, options, name: str) -> _Source:
    tf = _import_tf()
    shapes = dict(options.getoption("input_shape", {}) if options is not None else {})
    specs = []
    try:
        model_inputs = list(model.inputs)
    except Exception:
        model_inputs = []
    if not model_inputs:
        raise ModelFileError(f"Keras model {name} has no defined inputs", hint="build the model (call it once or give an Input)")
    for t in model_inputs:
        nm = getattr(t, "name", None) or "input"
        nm = nm.split(":")[0]
        shape = tuple(t.shape)
        if nm in shapes:
            shape = tuple(d if isinstance(d, int) else None for d in shapes[nm])
        specs.append(tf.TensorSpec(shape, getattr(t, "dtype", "float32"), name=nm))

    single = len(specs) == 1

    @tf.function(input_signature=specs)
    def serve(*xs):
        return model(xs[0] if single else list(xs), training=False)

    return _freeze(serve.get_concrete_function(), name)


def _load_keras_file(path: str, options) -> _Source:
    from .safety import check_keras_file

    _import_tf()
    import keras

    check_keras_file(path)  # no Lambda / custom objects (code), no HDF5 data in other files
    try:
        model = keras.models.load_model(path, compile=False, safe_mode=True)
    except Exception as e:
        raise ModelFileError(
            f"cannot load the Keras model '{path}': {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            hint="check that the file is a complete .keras / .h5 model",
        ) from None
    return _keras_function(model, options, path)


def _kind_of_object(obj: Any) -> str | None:
    mod = type(obj).__module__ or ""
    tname = type(obj).__name__
    if not mod.startswith(("tensorflow", "keras", "tf_keras")):
        # a subclass of a Keras model defined elsewhere
        for base in type(obj).__mro__:
            if (base.__module__ or "").startswith(("keras", "tf_keras")) and base.__name__ in ("Model", "Layer"):
                return "keras"
        return None
    if tname == "GraphDef":
        return "graph_def"
    if tname == "ConcreteFunction" or hasattr(obj, "structured_input_signature") and hasattr(obj, "graph"):
        return "concrete"
    if hasattr(obj, "get_concrete_function"):
        return "function"
    if hasattr(obj, "inputs") and callable(obj):
        return "keras"
    return None


def _load_object(obj: Any, options) -> _Source:
    kind = _kind_of_object(obj)
    label = f"<{type(obj).__name__}>"
    if kind == "graph_def":
        return _graph_def_source(obj, label)
    if kind == "concrete":
        return _freeze(obj, label)
    if kind == "function":
        try:
            cf = obj.get_concrete_function()
        except Exception as e:
            raise ModelFileError(
                f"cannot trace the tf.function {label}: {type(e).__name__}: {e}",
                hint="give the tf.function an input_signature, or pass fn.get_concrete_function(...)",
            ) from None
        return _freeze(cf, label)
    if kind == "keras":
        return _keras_function(obj, options, label)
    raise ModelFileError(f"the TensorFlow frontend cannot read a {type(obj).__name__}")


# ------------------------------------------------------------------------------------------
# preparing the graph
# ------------------------------------------------------------------------------------------
def _apply_input_shapes(gd, src: _Source, shapes: dict[str, tuple]) -> None:
    by_name = {n.name: n for n in gd.node if n.name in src.inputs}
    for name, dims in shapes.items():
        key = name.split(":")[0]
        n = by_name.get(key)
        if n is None:
            raise OptionError(
                f"input_shape names '{name}', which is not an input of {src.name}{close_matches(key, list(by_name))}",
                hint=f"the model's inputs: {', '.join(src.inputs) or 'none'}",
            )
        sp = n.attr["shape"].shape
        known = not sp.unknown_rank and len(sp.dim)
        check_dims(tuple(d.size if d.size >= 0 else None for d in sp.dim) if known else None, tuple(dims), name)
        sp.unknown_rank = False
        del sp.dim[:]
        for d in dims:
            sp.dim.add().size = d if isinstance(d, int) else -1


#: A node attribute that makes grappler's constant folding leave the node's arithmetic alone
#: (its SimplifyGraph skips nodes with an attribute named ``*_tpu_*``). Those rewrites are of no
#: use to the frontend, and some abort the process on valid graphs: MulConvPushDown builds a
#: TensorShape from a symbolic shape (``Check failed: size >= 0``) for Conv2D -> RealDiv by a
#: constant vector -> Mul by a constant vector, a common normalisation (TensorFlow 2.21).
_NO_SIMPLIFY = "_ge_tpu_no_simplify"


def _all_nodes(gd):
    yield from gd.node
    for f in gd.library.function:
        yield from f.node_def


def _grappler(tf, gd, fetches: list[str]):
    """Constant folding (and function inlining) by TensorFlow's grappler; ``gd`` on failure."""
    try:
        from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
        from tensorflow.python.grappler import tf_optimizer

        config = config_pb2.ConfigProto()
        config.graph_options.infer_shapes = True
        ro = config.graph_options.rewrite_options
        ro.optimizers[:] = ["constfold", "function", "dependency"]
        ro.meta_optimizer_iterations = 1
        with tf.Graph().as_default() as g:
            tf.import_graph_def(gd, name="")
            mg = tf.compat.v1.train.export_meta_graph(graph_def=g.as_graph_def(add_shapes=True), graph=g)
        for n in _all_nodes(mg.graph_def):
            n.attr[_NO_SIMPLIFY].b = True
        shapes = {}
        for n in mg.graph_def.node:
            if n.op == "Placeholder" and "shape" in n.attr:
                # Grappler allocates and fills a tensor for each input of static shape (gigabytes
                # for a big or hostile shape, a segfault when that fails); hide the shape from it.
                # The shapes TensorFlow inferred (``_output_shapes``) still drive the folding.
                shapes[n.name] = n.attr["shape"].shape.SerializeToString()
                n.attr["shape"].shape.Clear()
                n.attr["shape"].shape.unknown_rank = True
        fc = meta_graph_pb2.CollectionDef()
        for t in fetches:
            fc.node_list.value.append(t)
        mg.collection_def["train_op"].CopyFrom(fc)
        out = tf_optimizer.OptimizeGraph(config, mg)
        for n in _all_nodes(out):
            if _NO_SIMPLIFY in n.attr:
                del n.attr[_NO_SIMPLIFY]
        for n in out.node:
            if n.op == "Placeholder" and n.name in shapes:
                n.attr["shape"].shape.ParseFromString(shapes[n.name])
        return out
    except Exception:
        return gd


def _resolve_tensor(g, spec: str, src: _Source):
    spec = spec.strip()
    try:
        if ":" in spec:
            return g.get_tensor_by_name(spec)
        op = g.get_operation_by_name(spec)
    except (KeyError, ValueError):
        names = [op.name for op in g.get_operations()]
        raise OptionError(
            f"out_nodes '{spec}' names no node or tensor of {src.name}{close_matches(spec.split(':')[0], names)}",
            hint="use a node name or ATC's node_name:output_index",
        ) from None
    if not op.outputs:
        raise OptionError(f"out_nodes '{spec}': node '{op.name}' ({op.type}) has no outputs")
    return op.outputs[0]


def convert_source(src: _Source, options) -> Graph:
    from .convert import Converter, as_graph_output, tf_type
    from .safety import check_graph_ops
    from .validate import check_functions, check_graph_def, check_static_sizes, check_unsupported_attrs

    tf = _import_tf()
    gd = src.graph_def.__class__()
    gd.CopyFrom(src.graph_def)  # never modify the caller's GraphDef
    shapes = dict(options.getoption("input_shape", {}) if options is not None else {})
    if shapes:
        _apply_input_shapes(gd, src, shapes)
    check_graph_ops(gd, src.name)  # nothing that touches files or runs Python reaches grappler
    check_graph_def(gd, src.name)  # what would crash TensorFlow's importer or grappler
    check_unsupported_attrs(gd, src.name)
    out_nodes = [s.strip() for s in (options.getoption("out_nodes", []) if options is not None else []) if s.strip()]

    # resolve output specs against the unoptimized graph, then keep them through grappler
    with tf.Graph().as_default() as g0:
        try:
            tf.import_graph_def(gd, name="")
        except Exception as e:
            raise ModelFileError(
                f"{src.name}: TensorFlow cannot import the graph: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                hint="check that the model is a complete, frozen TensorFlow graph",
            ) from None
        check_static_sizes(g0, src.name)
        check_functions(gd, src.name)
        if out_nodes:
            outputs = [_resolve_tensor(g0, s, src).name for s in out_nodes]
            out_names = list(out_nodes)
        else:
            outputs, out_names = list(src.outputs), list(src.output_names)
    fetches = [f"{n}:0" for n in src.inputs] + outputs
    gd = _grappler(tf, gd, fetches)
    with tf.Graph().as_default() as tg:
        tf.import_graph_def(gd, name="")
    functions = {f.signature.name: f for f in gd.library.function}
    conv = Converter(tg, functions, src.name)
    out_tensors = [tg.get_tensor_by_name(t) for t in outputs]
    ops = conv.needed_ops(out_tensors)
    conv.check_supported(ops)

    graph = Graph("main")
    graph.opset_imports[""] = OPSET
    env: dict[str, Any] = {}
    used_inputs = {op.name for op in ops if op.type == "Placeholder"}
    for name in src.inputs:
        if name not in used_inputs:
            continue
        op = tg.get_operation_by_name(name)
        t = op.outputs[0]
        tt = tf_type(t)
        if tt.dtype is None:
            raise ModelFileError(f"{src.name}: input '{name}' has dtype {t.dtype.name}, which has no array equivalent")
        env[t.name] = graph.add_input(name, TensorType(tt.dtype, tt.shape))
    for op in ops:  # placeholders not declared as inputs (GraphDef objects list all)
        if op.type == "Placeholder" and op.outputs[0].name not in env:
            tt = tf_type(op.outputs[0])
            env[op.outputs[0].name] = graph.add_input(op.name, tt)
    conv.convert_ops(ops, graph, env)

    outs = []
    for tname, want in zip(outputs, out_names):
        v = env.get(tname)
        from ge_core.ir.graph import Value

        if not isinstance(v, Value):
            raise ModelFileError(f"{src.name}: output '{tname}' is not a tensor the engine can return")
        if v.name != want:
            if v.producer is not None and v.graph is graph and not v.is_graph_output and want not in graph.names:
                graph.rename_value(v, want)
            else:
                nm = want if want not in graph.names else graph.names.fresh(want)
                v = graph.add_node("Identity", [v], name=nm, output_names=[nm]).output
        else:
            v = as_graph_output(graph, v) if v.is_graph_output else v
        if v.type.dtype is None:
            v.type = tf_type(tg.get_tensor_by_name(tname))
        outs.append(v)
    graph.set_outputs(outs)
    graph.metadata.update({"source": src.name, "framework": "tensorflow", "tensorflow_version": tf.__version__})
    return graph


class TensorFlowFrontend(Frontend):
    """Reads frozen GraphDefs, SavedModels, Keras models and tf.functions."""

    name = "tensorflow"
    framework_ids = (3,)
    suffixes = (".pb", ".pbtxt") + _KERAS_SUFFIXES

    def accepts_object(self, obj: Any) -> bool:
        return _kind_of_object(obj) is not None

    def sniff(self, path: str, head: bytes) -> bool:
        if _is_saved_model_dir(path):
            return True
        return os.path.splitext(path)[1].lower() in self.suffixes

    def load(self, source: Any, options=None) -> Graph:
        src = self._source(source, options)
        try:
            return convert_source(src, options)
        except GEError:
            raise
        except Exception as e:
            raise ModelFileError(
                f"cannot convert {src.name}: {type(e).__name__}: {e}",
                hint="the model may be malformed or use a construct the TensorFlow frontend does not handle",
            ) from e

    def _source(self, source: Any, options) -> _Source:
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if not os.path.exists(path):
                raise ModelFileError(f"model file '{path}' does not exist", hint="check the path")
            if os.path.isdir(path):
                if not _is_saved_model_dir(path):
                    raise ModelFileError(
                        f"'{path}' is a directory without saved_model.pb: not a SavedModel",
                        hint="give a SavedModel directory, a frozen .pb or a Keras .keras/.h5 file",
                    )
                return _load_saved_model(path, options)
            if not os.path.isfile(path):  # a FIFO would block the reader, /dev/zero never ends
                raise ModelFileError(f"model file '{path}' is not a regular file",
                                     hint="give a frozen .pb, a SavedModel directory or a Keras .keras/.h5 file")
            base = os.path.basename(path)
            if base in _SAVED_MODEL_FILES and os.path.isdir(os.path.join(os.path.dirname(path) or ".", "variables")):
                return _load_saved_model(os.path.dirname(path) or ".", options)
            if os.path.splitext(path)[1].lower() in _KERAS_SUFFIXES:
                return _load_keras_file(path, options)
            return _load_graph_def_file(path)
        return _load_object(source, options)
