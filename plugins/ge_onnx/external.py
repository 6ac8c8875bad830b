"""Safe reading of tensors: embedded, external (next to the model file) and sparse.

External data is read by this module, never by ``onnx.load_external_data_for_model``, so that
every location is checked first: it must be relative, stay inside the model's folder once
``..`` and symlinks are resolved, name a regular file, and ``offset``/``length`` must lie inside
that file and match the tensor's dims before anything is allocated.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ge_core.errors import ModelFileError, SecurityError
from ge_sdk.paths import contained_file

#: A tensor whose dense form would exceed this many bytes is refused (sparse or hostile dims).
MAX_TENSOR_BYTES = 1 << 34  # 16 GiB

#: A sparse tensor is densified only if its dense form has at most this many elements, or at
#: most SPARSE_MAX_RATIO times its stored values: a few bytes claiming billions of zeros are refused.
SPARSE_FREE_ELEMENTS = 1 << 22
SPARSE_MAX_RATIO = 1024
#: The dense bytes all sparse tensors of one model may add beyond SPARSE_MAX_RATIO x their values.
SPARSE_MODEL_BUDGET = 1 << 30


class SparseBudget:
    """Dense bytes left for the sparse tensors of one model (shared by all its graphs)."""

    def __init__(self, nbytes: int = SPARSE_MODEL_BUDGET) -> None:
        self.left = nbytes


#: ONNX element types whose external bytes are the array's (little-endian, one element each):
#: read straight into it (a large weight is not held twice, as bytes then as an array, at load)
_DIRECT = {1: "f4", 2: "u1", 3: "i1", 4: "u2", 5: "i2", 6: "i4", 7: "i8", 9: "?", 10: "f2", 11: "f8",
           12: "u4", 13: "u8"}


def _itemsize(data_type: int) -> int | None:
    from onnx import TensorProto, helper

    if data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except Exception:
        return None
    return dt.itemsize


def _packed_bits(data_type: int) -> int | None:
    from onnx import TensorProto

    four_bit = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, n)}
    two_bit = {getattr(TensorProto, n) for n in ("INT2", "UINT2") if hasattr(TensorProto, n)}
    if data_type in four_bit:
        return 4
    if data_type in two_bit:
        return 2
    return None


def expected_nbytes(tensor) -> int | None:
    """Bytes the raw data of ``tensor`` must have according to its dims and type."""
    n = 1
    for d in tensor.dims:
        if d < 0:
            raise ModelFileError(f"tensor '{tensor.name}' has a negative dim {d}")
        n *= int(d)
    bits = _packed_bits(tensor.data_type)
    if bits is not None:
        return (n * bits + 7) // 8
    size = _itemsize(tensor.data_type)
    if size is None:
        return None
    return n * size


def _check_size(tensor, where: str) -> None:
    nb = expected_nbytes(tensor)
    if nb is not None and nb > MAX_TENSOR_BYTES:
        raise SecurityError(
            f"tensor '{tensor.name}'{where} would take {nb} bytes (dims {list(tensor.dims)}); refusing to allocate",
            hint="the model is corrupt or hostile",
        )


def _safe_location(tensor_name: str, location: str, base_dir: str, model_path: str) -> str:
    """The resolved path of an external data file, or SecurityError (the rule of ge_sdk.paths)."""
    return contained_file(base_dir, location, f"tensor '{tensor_name}' of {model_path}", "external data")


def read_external(tensor, base_dir: str | None, model_path: str) -> np.ndarray:
    """The array of a tensor whose ``data_location`` is EXTERNAL (the proto is not modified)."""
    from onnx import TensorProto, numpy_helper

    info = {_text(e.key): _text(e.value) for e in tensor.external_data}
    if base_dir is None:
        raise ModelFileError(
            f"tensor '{tensor.name}' of {model_path} is stored in external file '{info.get('location', '?')}' "
            "but the model was given as an object or bytes, so its folder is unknown",
            hint="load the model from its file path, or call onnx.load_external_data_for_model first",
        )
    path = _safe_location(tensor.name, info.get("location", ""), base_dir, model_path)
    what = f"tensor '{tensor.name}' of {model_path} (external file '{info.get('location')}')"
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") not in (None, "") else None
    except ValueError:
        raise ModelFileError(f"{what}: offset/length are not integers: {info}") from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelFileError(f"{what}: negative offset or length ({offset}, {length})")
    fsize = os.path.getsize(path)
    if length is None:
        length = max(fsize - offset, 0)
    if offset + length > fsize:
        raise ModelFileError(
            f"{what}: offset {offset} + length {length} is past the end of the file ({fsize} bytes)",
            hint="the data file is truncated or does not belong to this model",
        )
    _check_size(tensor, f" of {model_path}")
    expected = expected_nbytes(tensor)
    if expected is None:
        raise ModelFileError(f"{what}: external data of type {tensor.data_type} (e.g. STRING) is not supported")
    if expected != length:
        raise ModelFileError(
            f"{what}: holds {length} bytes but dims {list(tensor.dims)} need {expected}",
            hint="the data file does not match the model",
        )
    direct = _DIRECT.get(tensor.data_type)
    with open(path, "rb") as f:
        f.seek(offset)
        if direct is not None:  # read into the array itself: no bytes object, no proto copy
            arr = np.empty(tuple(int(d) for d in tensor.dims), np.dtype(direct).newbyteorder("<"))
            got = f.readinto(arr.reshape(-1).view(np.uint8).data) if length else 0
            if got != length:
                raise ModelFileError(f"{what}: short read ({got} of {length} bytes)")
            return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
        raw = f.read(length)
    if len(raw) != length:
        raise ModelFileError(f"{what}: short read ({len(raw)} of {length} bytes)")
    t = TensorProto()
    t.name = tensor.name
    t.data_type = tensor.data_type
    t.dims.extend(tensor.dims)
    t.raw_data = raw
    return numpy_helper.to_array(t)


def _text(x: Any) -> str:
    """An external_data key or value: protobuf hands back bytes when they are not valid UTF-8."""
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFileError(f"external data entry {x[:60]!r} is not valid UTF-8",
                                 hint="the model file is corrupt") from None
    return x


def tensor_to_array(tensor, base_dir: str | None, model_path: str) -> np.ndarray:
    """A TensorProto as a NumPy array, reading external data safely; errors are GEErrors."""
    from onnx import TensorProto, numpy_helper

    if tensor.HasField("data_location") and tensor.data_location == TensorProto.EXTERNAL:
        return read_external(tensor, base_dir, model_path)
    _check_size(tensor, f" of {model_path}")
    expected = expected_nbytes(tensor)
    if tensor.HasField("raw_data") and expected is not None and len(tensor.raw_data) != expected:
        raise ModelFileError(
            f"tensor '{tensor.name}' of {model_path} holds {len(tensor.raw_data)} bytes but dims "
            f"{list(tensor.dims)} need {expected}",
            hint="the model file is corrupt",
        )
    try:
        arr = numpy_helper.to_array(tensor)
    except Exception as e:
        raise ModelFileError(f"tensor '{tensor.name}' of {model_path} cannot be read: {e}") from None
    if arr.dtype == np.dtype(object):
        arr = np.vectorize(_decode, otypes=[object])(arr) if arr.size else arr
    return arr


def _decode(x: Any) -> Any:
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return x
    return x


def sparse_to_array(sp, base_dir: str | None, model_path: str, budget: SparseBudget | None = None) -> np.ndarray:
    """The dense array of a SparseTensorProto (sizes checked before anything is allocated)."""
    values = tensor_to_array(sp.values, base_dir, model_path)
    indices = tensor_to_array(sp.indices, base_dir, model_path).astype(np.int64, copy=False)
    dims = [int(d) for d in sp.dims]
    n = 1
    for d in dims:
        if d < 0:
            raise ModelFileError(f"sparse tensor '{sp.values.name}' of {model_path} has a negative dim")
        n *= d
    nbytes = n * max(values.dtype.itemsize, 1)
    what = f"sparse tensor '{sp.values.name}' of {model_path}"
    if nbytes > MAX_TENSOR_BYTES or n > max(SPARSE_FREE_ELEMENTS, SPARSE_MAX_RATIO * values.size):
        raise SecurityError(
            f"{what} has {values.size} stored values but dims {dims} would take {nbytes} bytes densely; "
            "refusing to allocate", hint="the model is corrupt or hostile")
    if budget is not None and n > SPARSE_MAX_RATIO * values.size:
        if nbytes > budget.left:
            raise SecurityError(f"{what}: the sparse tensors of the model would take more than "
                                f"{SPARSE_MODEL_BUDGET} bytes densely; refusing to allocate",
                                hint="the model is corrupt or hostile")
        budget.left -= nbytes
    dense = np.zeros(n, dtype=values.dtype)
    flat_vals = values.reshape(-1)
    if indices.ndim == 2:
        if indices.shape[1] != len(dims):
            raise ModelFileError(f"sparse tensor '{sp.values.name}' of {model_path}: indices do not match its rank")
        lin = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else np.zeros(0, np.int64)
    else:
        lin = indices.reshape(-1)
    if lin.size != flat_vals.size or (lin.size and (lin.min() < 0 or lin.max() >= n)):
        raise ModelFileError(f"sparse tensor '{sp.values.name}' of {model_path} has bad indices")
    dense[lin] = flat_vals
    return dense.reshape(dims)


#: files larger than this are not scanned for external data names
MAX_SCAN_BYTES = 1 << 31
_LOCATION = b"\x0a\x08location\x12"  # an ONNX StringStringEntryProto whose key is "location"


def external_data_files(path: str) -> list[str]:
    """The external data files an ONNX model at ``path`` names (found in its bytes without
    parsing them; a false match only protects one more file), for :class:`ge_core.writes.InputFiles`:
    no output of a command may write over them. The file is read in chunks, never mapped: a file
    truncated meanwhile cannot end the process."""
    folder = os.path.dirname(os.path.abspath(path))
    out: list[str] = []
    chunk, keep = 1 << 22, len(_LOCATION) + 5 + 4096  # a match and its value never fall between chunks
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size or size > MAX_SCAN_BYTES:
                return out
            buf = b""
            while len(out) < 100_000:
                more = f.read(chunk)
                buf += more
                at, limit = buf.find(_LOCATION), (len(buf) if not more else len(buf) - keep)
                last = 0
                while 0 <= at < limit and len(out) < 100_000:
                    i, n, shift = at + len(_LOCATION), 0, 0
                    while i < len(buf) and shift < 35:  # the varint length of the value
                        b = buf[i]
                        n |= (b & 0x7F) << shift
                        i, shift = i + 1, shift + 7
                        if not b & 0x80:
                            break
                    try:
                        rel = buf[i:i + min(n, 4096)].decode("utf-8")
                    except UnicodeDecodeError:
                        rel = ""
                    if rel and "\0" not in rel:
                        out.append(os.path.join(folder, rel.replace("\\", "/")))
                    last = i
                    at = buf.find(_LOCATION, i)
                if not more:
                    break
                buf = buf[max(last, len(buf) - keep):]
    except (OSError, ValueError):
        pass
    return out
