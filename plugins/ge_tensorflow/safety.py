"""What a TensorFlow or Keras model file may not do: run Python, reach files outside its folder.

TensorFlow and Keras trust what they load. Before they see a file from outside, the frontend
refuses (:class:`ModelFileError`, or :class:`SecurityError` for paths, naming the file):

* :func:`check_graph_ops`, on every graph (frozen ``.pb``, the graphs and functions of a
  SavedModel, the frozen graph of any source): ops that touch the file system or run Python
  (``ReadFile``/``WriteFile``, ``ImmutableConst``'s memory-mapped path, file readers and
  datasets, summary writers, ``Debug*`` ops with their dump URLs, ``PrintV2`` to a file,
  ``PyFunc``/``EagerPyFunc``). TensorFlow runs a SavedModel's initializers while loading it and
  grappler evaluates ops while it folds constants, so such an op is refused wherever it is;
* :func:`check_saved_model`: every entry of the folder (``variables/``, ``assets/``, anything)
  resolves inside it and is a regular file or folder (:func:`ge_sdk.paths.check_folder_contained`:
  a link to a file outside, to ``/etc`` or ``/dev/zero``, or a FIFO is refused); every asset
  file the MetaGraphs name stays inside ``assets/`` (:func:`ge_sdk.paths.contained_file`);
* :func:`check_keras_file`: the model config (``config.json`` of a ``.keras`` zip, the
  ``model_config`` attribute of an ``.h5``) has no ``Lambda`` layer or serialized function
  (marshalled Python bytecode) and no class outside Keras (custom objects are code); HDF5 weights
  have no external storage, virtual datasets or external links (they read other files). The
  model is then loaded with ``safe_mode=True`` as well.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any

from ge_core.errors import ModelFileError
from ge_sdk.paths import check_folder_contained, contained_file

from .validate import graph_nodes

#: Ops refused in any graph read from outside.
DENIED_OPS = frozenset({
    "ReadFile", "WriteFile", "MatchingFiles", "ImmutableConst", "PyFunc", "PyFuncStateless", "EagerPyFunc",
    "FixedLengthRecordReader", "FixedLengthRecordReaderV2", "TextLineReader", "TextLineReaderV2",
    "TFRecordReader", "TFRecordReaderV2", "WholeFileReader", "WholeFileReaderV2", "LMDBReader",
    "IdentityReader", "IdentityReaderV2", "ReaderReadV2", "TextLineDataset", "TFRecordDataset",
    "TFRecordDatasetV2", "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2", "LMDBDataset",
    "ExperimentalLMDBDataset", "SaveDataset", "SaveDatasetV2", "LoadDataset", "SnapshotDataset",
    "SnapshotDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset", "SqlDataset",
    "ExperimentalSqlDataset", "CreateSummaryFileWriter", "CreateSummaryDbWriter", "SummaryWriter",
    "WriteSummary", "WriteScalarSummary", "WriteHistogramSummary", "WriteImageSummary", "WriteAudioSummary",
    "WriteGraphSummary", "WriteRawProtoSummary", "ImportEvent", "FlushSummaryWriter", "CloseSummaryWriter",
    "DecodeProtoV2", "EncodeProto", "LoadAndRemapMatrix", "GenerateVocabRemapping", "InitializeTableFromTextFile",
    "InitializeTableFromTextFileV2",
})
_HINT = ("a model file must be data: GE refuses ops that read or write files or run Python; "
         "freeze the inference graph without them (load the data as model inputs instead)")


def check_graph_ops(gd, source: str, *, allow_assets: bool = False) -> None:
    """Refuse a GraphDef with an op of :data:`DENIED_OPS`, a ``Debug*`` op or ``PrintV2`` to a file.

    ``allow_assets`` lets a SavedModel initialize lookup tables from text files (its assets, whose
    paths :func:`check_saved_model` has checked).
    """
    for where, n in graph_nodes(gd):
        op = n.op
        if allow_assets and op in ("InitializeTableFromTextFile", "InitializeTableFromTextFileV2"):
            continue
        bad = op in DENIED_OPS or op.startswith("Debug")
        if op == "PrintV2" and "output_stream" in n.attr:
            stream = n.attr["output_stream"].s.decode("utf-8", "replace")
            bad = stream not in ("stderr", "stdout", "log(info)", "log(warning)", "log(error)")
        if bad:
            raise ModelFileError(f"{source}: {where}node '{n.name}' ({op}) reads or writes files or runs Python",
                                 hint=_HINT)


# ------------------------------------------------------------------------------------------
# SavedModel
# ------------------------------------------------------------------------------------------
def check_saved_model(path: str) -> None:
    """Refuse a SavedModel folder that leads outside itself or holds a refused op (see module doc)."""
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    what = f"SavedModel '{path}'"
    check_folder_contained(path, what)
    sm = saved_model_pb2.SavedModel()
    pb, pbtxt = os.path.join(path, "saved_model.pb"), os.path.join(path, "saved_model.pbtxt")
    try:
        if os.path.isfile(pb):
            with open(pb, "rb") as f:
                sm.ParseFromString(f.read())
        else:
            with open(pbtxt, encoding="utf-8") as f:
                text_format.Parse(f.read(), sm)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError, OSError, RecursionError) as e:
        raise ModelFileError(f"{what}: saved_model.pb cannot be parsed ({type(e).__name__})",
                             hint="check that the directory is a complete SavedModel") from None
    assets = os.path.join(path, "assets")
    for mg in sm.meta_graphs:
        for a in mg.asset_file_def:
            contained_file(assets, a.filename, f"{what}: asset '{a.tensor_info.name}'", "asset")
        check_graph_ops(mg.graph_def, what, allow_assets=True)


# ------------------------------------------------------------------------------------------
# Keras
# ------------------------------------------------------------------------------------------
_KERAS_HINT = ("Lambda layers and custom objects are Python code; GE loads only built-in Keras layers "
               "from a file. Replace the Lambda by a layer, or load the model yourself (trusting it) "
               "and pass the model object: ge.load(keras_model)")
_KERAS_MODULES = ("keras", "tf_keras", "builtins")


def check_keras_config(config: Any, source: str, depth: int = 0) -> None:
    """Refuse a Keras model config with a Lambda, a serialized function or a non-Keras class."""
    if depth > 500:
        raise ModelFileError(f"{source}: the model config is nested too deeply", hint="the file is corrupt or hostile")
    if isinstance(config, dict):
        cls = config.get("class_name")
        if cls in ("Lambda", "__lambda__", "TFOpLambda"):
            name = (config.get("config") or {}).get("name") if isinstance(config.get("config"), dict) else None
            raise ModelFileError(f"{source}: layer '{name or cls}' ({cls}) carries Python code", hint=_KERAS_HINT)
        mod = config.get("module")
        if isinstance(mod, str) and not (mod in _KERAS_MODULES or mod.startswith(tuple(m + "." for m in _KERAS_MODULES))):
            raise ModelFileError(f"{source}: class '{cls}' comes from module '{mod}', not Keras (a custom object)",
                                 hint=_KERAS_HINT)
        reg = config.get("registered_name")
        if isinstance(reg, str) and ">" in reg:
            raise ModelFileError(f"{source}: '{reg}' is a registered custom object", hint=_KERAS_HINT)
        for v in config.values():
            check_keras_config(v, source, depth + 1)
    elif isinstance(config, list):
        for v in config:
            check_keras_config(v, source, depth + 1)


def _check_h5(h5, source: str) -> None:
    """Refuse HDF5 content that reads other files (external storage, virtual datasets, external links)."""
    import h5py

    def visit(name: str, link: Any) -> None:
        if isinstance(link, h5py.ExternalLink):
            raise ModelFileError(f"{source}: HDF5 entry '{name}' is a link to another file ({link.filename})",
                                 hint="the weights must be inside the model file")

    h5.visititems_links(visit)

    def visit_ds(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            if obj.is_virtual or obj.external:
                raise ModelFileError(f"{source}: HDF5 dataset '{name}' stores its data in other files",
                                     hint="the weights must be inside the model file")

    h5.visititems(visit_ds)


def _json(raw: bytes | str, source: str, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{source}: {what} is not valid JSON ({type(e).__name__})",
                             hint="the file is corrupt") from None


def check_keras_file(path: str) -> None:
    """Refuse a ``.keras``/``.h5`` file whose config or weights would run code or read other files."""
    import h5py

    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                info = z.getinfo("config.json")
                if info.file_size > 256 << 20:
                    raise ModelFileError(f"{path}: config.json has {info.file_size} bytes", hint="the file is hostile")
                check_keras_config(_json(z.read(info), path, "config.json"), path)
                for entry in z.infolist():
                    if entry.filename.endswith(".h5"):
                        with z.open(entry) as f, h5py.File(f, "r") as h5:
                            _check_h5(h5, f"{path} ({entry.filename})")
        except KeyError:
            raise ModelFileError(f"{path}: a .keras archive without config.json", hint="re-save the model") from None
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise ModelFileError(f"{path}: the .keras archive cannot be read ({e})", hint="the file is corrupt") from None
        return
    try:
        with h5py.File(path, "r") as h5:
            cfg = h5.attrs.get("model_config")
            if cfg is None:
                raise ModelFileError(f"{path}: an HDF5 file without a model_config (weights only?)",
                                     hint="save the whole model with model.save(path)")
            check_keras_config(_json(cfg, path, "model_config"), path)
            _check_h5(h5, path)
    except OSError as e:
        raise ModelFileError(f"{path}: not a Keras .keras/.h5 file ({e})", hint="re-save the model") from None
