"""References run by the source model's own framework: ``ge compare --reference tensorflow|torch``.

* ``tensorflow``: a frozen GraphDef (``.pb`` / ``.pbtxt``) in a ``tf.compat.v1`` session, a
  SavedModel through its signature (``serving_default``, else the first by name, or
  ``--option signature=NAME``), a Keras file (``.keras`` / ``.h5``) loaded with
  ``safe_mode=True`` and called with ``training=False``.
* ``torch``: a ``.pt2`` program, read by the torch frontend's own reader (which unpickles
  nothing: never ``torch.export.load``), run as the module ``ExportedProgram.module()`` gives.

Before the framework sees the file, the registered frontend loads it (``ge.load``): its checks
(TensorFlow ops that read or write files or run Python, Keras Lambda layers and custom objects,
links out of a SavedModel folder, pickles in a ``.pt2``) refuse a hostile model here as they do
at compile time. The reference's outputs are returned under the compiled model's output names:
by name where the framework names them so, else in order.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ge_core.errors import GEError, ModelFileError, OptionError

FRAMEWORK_REFERENCES = ("tensorflow", "torch")
_KERAS = (".keras", ".h5", ".hdf5")
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def run_framework(kind: str, source: str | None, model, feeds: Mapping[str, np.ndarray], *,
                  signature: str | None = None) -> dict[str, np.ndarray]:
    """The outputs of ``source`` run by ``kind`` on ``feeds``, by ``model``'s output names."""
    import ge_core as ge

    if source is None:
        raise OptionError(f"--reference {kind} runs the source model, and it is not known here",
                          hint="give it with --source MODEL")
    if not os.path.exists(source):
        raise ModelFileError(f"source model '{source}' does not exist", hint="give it with --source MODEL")
    ge.load(source, framework=kind)  # the frontend's safety checks, before the framework reads the file
    names = list(model.output_names)
    if kind == "tensorflow":
        outs = _tensorflow(source, list(model.input_names), names, feeds, signature)
    elif kind == "torch":
        outs = _torch(source, list(model.input_names), feeds)
    else:
        raise OptionError(f"unknown framework reference '{kind}'", hint=f"choose one of {', '.join(FRAMEWORK_REFERENCES)}")
    return _by_output_names(kind, source, names, outs)


def _by_output_names(kind: str, source: str, names: Sequence[str], outs: Any) -> dict[str, np.ndarray]:
    if isinstance(outs, dict):
        if set(names) <= set(outs):
            return {n: outs[n] for n in names}
        outs = [outs[k] for k in sorted(outs)]
    outs = list(outs)
    if len(outs) != len(names):
        raise GEError(f"{kind} gives {len(outs)} output(s) for '{source}', the compiled model has {len(names)} "
                      f"({', '.join(names)})", hint="compile the model without out_nodes, or compare with --reference onnxruntime")
    return dict(zip(names, outs))


# -- TensorFlow ------------------------------------------------------------------------------------
def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        raise OptionError("--reference tensorflow needs the tensorflow package",
                          hint="pip install 'ge-python[tensorflow]'") from None
    return tf


def _tensorflow(source: str, inputs: list[str], outputs: list[str], feeds: Mapping[str, np.ndarray],
                signature: str | None) -> Any:
    tf = _tf()
    path = source
    if os.path.basename(path) in _SAVED_MODEL_FILES:
        path = os.path.dirname(path) or "."
    try:
        if os.path.isdir(path):
            return _saved_model(tf, path, inputs, feeds, signature)
        if os.path.splitext(path)[1].lower() in _KERAS:
            return _keras(tf, path, inputs, feeds)
        return _graph_def(tf, path, inputs, outputs, feeds)
    except GEError:
        raise
    except Exception as e:
        raise GEError(f"tensorflow failed to run '{source}': {type(e).__name__}: {str(e).strip()[:300]}") from None


def _saved_model(tf, path: str, inputs: list[str], feeds: Mapping[str, np.ndarray], signature: str | None) -> Any:
    loaded = tf.saved_model.load(path)
    sigs = dict(loaded.signatures)
    want = signature or ("serving_default" if "serving_default" in sigs else sorted(sigs)[0])
    if want not in sigs:
        raise OptionError(f"SavedModel '{path}' has no signature '{want}'", hint=f"signatures: {', '.join(sorted(sigs))}")
    fn = sigs[want]
    specs = fn.structured_input_signature[1]
    args = {}
    for k, spec in specs.items():
        name = (getattr(spec, "name", None) or k).split(":")[0]
        key = k if k in feeds else name
        if key not in feeds:
            raise GEError(f"SavedModel '{path}' signature '{want}' takes '{k}', which the compiled model has no input "
                          f"for (inputs: {', '.join(inputs)})")
        args[k] = tf.constant(feeds[key])
    out = fn(**args)
    return {k: v.numpy() for k, v in out.items()} if isinstance(out, dict) else [t.numpy() for t in tf.nest.flatten(out)]


def _keras(tf, path: str, inputs: list[str], feeds: Mapping[str, np.ndarray]) -> Any:
    import keras

    model = keras.models.load_model(path, compile=False, safe_mode=True)
    names = [str(getattr(t, "name", "") or "").split(":")[0] for t in model.inputs]
    xs = []
    for i, nm in enumerate(names):
        key = nm if nm in feeds else (inputs[i] if i < len(inputs) else "")
        if key not in feeds:
            raise GEError(f"Keras model '{path}' takes input '{nm}', which the compiled model has no input for "
                          f"(inputs: {', '.join(inputs)})")
        xs.append(tf.constant(feeds[key]))
    out = model(xs[0] if len(xs) == 1 else xs, training=False)
    return [np.asarray(t) for t in tf.nest.flatten(out)]


def _graph_def(tf, path: str, inputs: list[str], outputs: list[str], feeds: Mapping[str, np.ndarray]) -> Any:
    with open(path, "rb") as f:
        data = f.read()
    gd = tf.compat.v1.GraphDef()
    if path.endswith(".pbtxt"):
        from google.protobuf import text_format

        text_format.Parse(data.decode("utf-8"), gd)
    else:
        gd.ParseFromString(data)
    with tf.Graph().as_default() as g:
        tf.import_graph_def(gd, name="")
        fetches = [g.get_tensor_by_name(n if ":" in n else f"{n}:0") for n in outputs]
        feed = {g.get_tensor_by_name(f"{k}:0"): v for k, v in feeds.items() if k in inputs}
        with tf.compat.v1.Session(graph=g) as sess:
            return list(sess.run(fetches, feed))


# -- PyTorch ---------------------------------------------------------------------------------------
def _torch(source: str, inputs: list[str], feeds: Mapping[str, np.ndarray]) -> Any:
    try:
        import torch
    except ImportError:
        raise OptionError("--reference torch needs the torch package", hint="pip install 'ge-python[torch]'") from None
    ep = read_exported_program(source)
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if len(users) != len(inputs):
        raise GEError(f"'{source}' takes {len(users)} input(s) ({', '.join(users)}), the compiled model "
                      f"{len(inputs)} ({', '.join(inputs)})")
    args = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in inputs]
    try:
        with torch.no_grad():
            out = ep.module()(*args)
    except Exception as e:
        raise GEError(f"torch failed to run '{source}': {type(e).__name__}: {str(e).strip()[:300]}") from None
    flat = out if isinstance(out, (list, tuple)) else [out]
    return [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in flat]


def read_exported_program(path: str) -> Any:
    """The ``ExportedProgram`` of a ``.pt2`` file, read by the registered ``torch`` frontend's
    reader (``export_program`` of its module: the frontend interface has no method for the
    framework's own program, and a plugin does not import another). Never ``torch.export.load``."""
    from ge_core.plugins import get_host

    fe = get_host().registries.frontends.get("torch")
    module = sys.modules.get(type(fe).__module__) if fe is not None else None
    reader = getattr(module, "export_program", None)
    if reader is None:
        raise OptionError("--reference torch needs the torch frontend's .pt2 reader, and no 'torch' frontend "
                          "with one is registered", hint="is the ge_torch plugin disabled (GE_DISABLE_PLUGINS)?")
    ep, _label, _dims = reader(path)
    return ep
