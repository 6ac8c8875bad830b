"""``onnx.backend`` adapter: run ONNX's backend test suite (and any onnx.backend user) on GE.

>>> import ge_onnx.backend as backend
>>> rep = backend.prepare(model)            # doctest: +SKIP
>>> outputs = rep.run([x])                  # doctest: +SKIP

The model is loaded with ``ge_core.load`` and compiled with ``ge_core.compile``; keyword
arguments of :meth:`GEBackend.prepare` that are compile options are passed on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

import ge_core

_DEVICES = {"CPU"}


class GEBackendRep(BackendRep):
    """A compiled model; ``run`` takes a list (graph-input order), a dict or one array.

    As in onnxruntime, a list fills the inputs that must be fed first (those without a default,
    in graph order), then those with one (initializers listed as inputs), which may be left out.
    """

    def __init__(self, compiled) -> None:
        self.model = compiled
        defaults = compiled.input_defaults
        self.defaults = defaults
        self.input_names = [n for n in compiled.input_names if n not in defaults] + list(defaults)
        self.output_names = list(compiled.output_names)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) > len(self.input_names):
                raise ge_core.InputError(
                    f"{len(inputs)} inputs given, the model takes {len(self.input_names)}: {', '.join(self.input_names)}"
                )
            feeds = dict(zip(self.input_names, inputs))
        feeds = {k: _as_feed(v) for k, v in feeds.items()}
        if all(isinstance(v, np.ndarray) for v in feeds.values()):
            out = self.model.run(feeds)
            return tuple(out[name] for name in self.output_names)
        # ONNX sequences (lists) and empty optionals (None): CompiledModel.run's feed check
        # converts every feed with np.asarray, which would turn a sequence into one tensor;
        # check the names here and hand the values to the executable unchanged.
        known = set(self.input_names)
        missing = [n for n in self.input_names if n not in feeds and n not in self.defaults]
        unknown = [k for k in feeds if k not in known]
        if missing or unknown:
            raise ge_core.InputError(f"inputs {sorted(feeds)} do not match the model's {self.input_names}")
        for name, default in self.defaults.items():
            feeds.setdefault(name, default)
        outs = self.model.executable.run(feeds)
        return tuple(outs)


def _as_feed(v: Any) -> Any:
    """An ndarray, or a list (ONNX sequence) / None (empty optional) kept as they are."""
    if v is None or isinstance(v, (np.ndarray, list)):
        return v
    if isinstance(v, tuple):
        return list(v)
    return np.asarray(v)


def _device_ok(device: str) -> bool:
    try:
        d = Device(device)
    except Exception:
        return False
    return d.type == DeviceType.CPU


_COMPILE_KEYS = None


def _split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments that are compile options (others, e.g. onnx's, are ignored)."""
    import dataclasses

    global _COMPILE_KEYS
    if _COMPILE_KEYS is None:
        _COMPILE_KEYS = {f.name for f in dataclasses.fields(ge_core.CompileOptions)} - {"extra"}
    return {k: v for k, v in kwargs.items() if k in _COMPILE_KEYS}


class GEBackend(Backend):
    """GE as an ``onnx.backend``."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> GEBackendRep:
        if not cls.supports_device(device):
            raise ge_core.OptionError(f"device '{device}' is not supported by the GE backend", hint="use 'CPU'")
        if isinstance(model, (bytes, bytearray)):
            model = onnx.load_model_from_string(bytes(model))
        elif isinstance(model, str):
            model = onnx.load(model)
        opts = _split_options(kwargs)
        load_opts = {k: opts[k] for k in ("input_shape", "out_nodes") if k in opts}
        graph = ge_core.load(model, framework="onnx", **load_opts)
        compiled = ge_core.compile(graph, {k: v for k, v in opts.items() if k not in load_opts})
        return GEBackendRep(compiled)

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs: Any, device: str = "CPU", outputs_info: Sequence[tuple] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one NodeProto on ``inputs`` (a list in node-input order, or a dict by name)."""
        in_names = [n for n in node.input if n]
        if isinstance(inputs, dict):
            arrays = {k: _as_feed(v) for k, v in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            arrays = {name: _as_feed(x) for name, x in zip(in_names, inputs)}
        value_infos = []
        for name in in_names:
            if name not in arrays:
                raise ge_core.InputError(f"run_node: no value given for input '{name}' of node '{node.name}'")
            a = arrays[name]
            if isinstance(a, np.ndarray):
                value_infos.append(_value_info(name, a.dtype, a.shape))
            else:  # a sequence or an empty optional: type left to the node
                value_infos.append(helper.make_empty_tensor_value_info(name))
        out_names = [n for n in node.output if n]
        outputs = []
        for i, name in enumerate(out_names):
            if outputs_info is not None and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                outputs.append(_value_info(name, np.dtype(dtype), shape))
            else:
                outputs.append(helper.make_empty_tensor_value_info(name))
        opset = kwargs.pop("opset_version", None)
        domain = node.domain or ""
        opsets = [helper.make_opsetid("", int(opset) if opset and not domain else onnx.defs.onnx_opset_version())]
        if domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid(domain, int(opset) if opset else 1))
        graph = helper.make_graph([node], f"run_node_{node.op_type}", value_infos, outputs)
        model = helper.make_model(graph, opset_imports=opsets, producer_name="ge_onnx.backend")
        rep = cls.prepare(model, device, **kwargs)
        return rep.run([arrays[n] for n in in_names])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return _device_ok(device)


def _value_info(name: str, dtype: np.dtype, shape):
    if dtype == np.dtype(object) or dtype.kind in ("U", "S"):
        elem = onnx.TensorProto.STRING
    else:
        elem = helper.np_dtype_to_tensor_dtype(dtype)
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


prepare = GEBackend.prepare
run_model = GEBackend.run_model
run_node = GEBackend.run_node
supports_device = GEBackend.supports_device
is_compatible = GEBackend.is_compatible
