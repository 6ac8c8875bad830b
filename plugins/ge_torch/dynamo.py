"""``torch.compile(model, backend="ge")``: a TorchDynamo backend that runs FX graphs on GE.

Registered through torch's own entry-point group (``torch_dynamo_backends``: ``ge =
"ge_torch.dynamo:ge_backend"``), so no import of this package is needed. For each FX graph
Dynamo hands over, :func:`ge_backend` returns a callable that

* compiles the graph on first use for each *input signature* (dtypes, shapes, devices, Python
  scalars) with the default GE pipeline (``torch.export`` of the FX graph, core-ATen lowering,
  the ``torch`` op mappers, ``ge.compile``) and caches the compiled model;
* bakes parameters and buffers (Dynamo passes them as graph inputs) into the graph as
  constants, and recompiles if one of them is replaced or modified in place;
* falls back to eager PyTorch, with a warning naming the op and the module it came from, for a
  graph GE cannot take;
* exchanges tensors without copies where the layout allows (``Tensor.numpy()`` for CPU
  tensors, ``torch.from_numpy`` for results).

It is an inference backend: results do not carry autograd history.

Options: ``torch.compile(model, backend="ge", options={"opt_level": 3})`` passes compile options.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ge_core.errors import GEError

log = logging.getLogger("ge.torch")


def ge_backend(gm: Any, example_inputs: Sequence[Any], **options: Any) -> GeGraphCallable:
    """The ``ge`` Dynamo backend: ``compiler_fn(gm, example_inputs) -> callable``."""
    opts = dict(options.pop("options", None) or {})
    opts.update(options)
    return GeGraphCallable(gm, example_inputs, opts)


class _Entry:
    __slots__ = ("model", "feeds", "plan", "out_spec", "baked")

    def __init__(self, model, feeds, plan, out_spec, baked) -> None:
        self.model, self.feeds, self.plan, self.out_spec, self.baked = model, feeds, plan, out_spec, baked


_FALLBACK = object()


class GeGraphCallable:
    """One Dynamo FX graph: compiled per input signature, eager where GE cannot run it."""

    def __init__(self, gm: Any, example_inputs: Sequence[Any], options: dict[str, Any]) -> None:
        self.gm = gm
        self.options = options
        self.cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._const_positions = _weight_positions(gm, example_inputs)
        self._warned_grad = False
        self.fallback_reason: str | None = None

    # -- signature ------------------------------------------------------------------------
    @staticmethod
    def signature(args: Sequence[Any]) -> tuple:
        import torch

        key: list[tuple] = []
        for a in args:
            if isinstance(a, torch.Tensor):
                key.append((str(a.dtype), tuple(a.shape), a.device.type))
            else:
                key.append(("py", type(a).__name__, a if isinstance(a, (int, float, bool, str, type(None))) else id(a)))
        return tuple(key)

    # -- call -----------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        key = self.signature(args)
        entry = self.cache.get(key)
        if entry is not None and entry is not _FALLBACK and not _baked_still_valid(entry.baked, args):
            entry = None
        if entry is None:
            with self._lock:
                entry = self._compile(args, key)
        if entry is _FALLBACK:
            return self.gm(*args)
        return self._run(entry, args)

    def _run(self, entry: _Entry, args: Sequence[Any]) -> Any:
        import torch
        from torch.utils._pytree import tree_unflatten

        if not self._warned_grad and torch.is_grad_enabled() and any(
                isinstance(args[i], torch.Tensor) and args[i].requires_grad for _, i in entry.feeds):
            self._warned_grad = True
            warnings.warn("backend 'ge' runs inference only: its results carry no autograd history",
                          stacklevel=3)
        feeds = {name: _to_numpy(args[i]) for name, i in entry.feeds}
        outs = entry.model.run(feeds)
        res = []
        for p in entry.plan:
            if isinstance(p, str):
                res.append(_to_torch(outs[p]))
            else:
                res.append(p[1])
        return tree_unflatten(res, entry.out_spec) if entry.out_spec is not None else res

    # -- compile --------------------------------------------------------------------------
    def _compile(self, args: Sequence[Any], key: tuple) -> Any:
        entry = self.cache.get(key)
        if entry is not None and (entry is _FALLBACK or _baked_still_valid(entry.baked, args)):
            return entry
        try:
            entry = compile_graph(self.gm, args, self._const_positions, self.options)
        except Exception as e:  # anything GE cannot take runs eagerly
            reason = e.detail if isinstance(e, GEError) else f"{type(e).__name__}: {e}"
            self.fallback_reason = reason
            warnings.warn(f"backend 'ge' cannot compile this graph, running it in eager PyTorch: {reason}",
                          RuntimeWarning, stacklevel=4)
            log.debug("fallback", exc_info=True)
            entry = _FALLBACK
        self.cache[key] = entry
        return entry


def compile_graph(gm: Any, args: Sequence[Any], const_positions: set[int], options: dict[str, Any]) -> _Entry:
    """Export ``gm`` at ``args``, convert it and compile it with GE."""
    import torch

    import ge_core as ge

    from .convert import Converter
    from .frontend import lower, torch_mappers

    mappers = torch_mappers()
    with torch.no_grad():
        ep = torch.export.export(gm, tuple(args), strict=False)
    ep = lower(ep, mappers)
    baked = {i: args[i] for i in const_positions if i < len(args) and isinstance(args[i], torch.Tensor)}
    names = [f"arg{i}" for i in range(len(args))]
    conv = Converter(mappers, source=f"<torch.compile graph {type(gm).__name__}>")
    graph, plan = conv.convert_program(ep, name="dynamo_graph", const_user_inputs=baked, input_names=names)
    model = ge.compile(graph, options)
    by_name = {v.name: v for v in graph.inputs}
    feeds = []
    for i in range(len(args)):
        if names[i] in by_name:
            feeds.append((names[i], i))
    out_plan: list[Any] = []
    for p in plan:
        if hasattr(p, "type"):
            out_plan.append(p.name)
        else:
            out_plan.append(("const", p))
    out_spec = getattr(getattr(ep, "call_spec", None), "out_spec", None)
    return _Entry(model, feeds, out_plan, out_spec, [(i, t, t._version) for i, t in baked.items()])


def _baked_still_valid(baked: list[tuple[int, Any, int]], args: Sequence[Any]) -> bool:
    for i, t, version in baked:
        a = args[i]
        if a is not t or a._version != version:
            return False
    return True


def _weight_positions(gm: Any, example_inputs: Sequence[Any]) -> set[int]:
    """Positions of the graph inputs that are module parameters or buffers."""
    import torch

    out: set[int] = set()
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (ph, ex) in enumerate(zip(phs, example_inputs)):
        if isinstance(ex, torch.nn.Parameter):
            out.add(i)
            continue
        src: Any = getattr(ph.meta.get("grapharg"), "source", None)
        try:
            attr = getattr(src, "name", None)
            name = str(attr() if callable(attr) else attr or "")
        except Exception:
            name = ""
        text = f"{name} {ph.target}"
        if "_buffers" in text or "_parameters" in text:
            out.add(i)
    return out


# ------------------------------------------------------------------------------------------
# zero-copy exchange
# ------------------------------------------------------------------------------------------
def _to_numpy(t: Any) -> Any:
    import torch

    if not isinstance(t, torch.Tensor):
        return np.asarray(t)
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype == torch.bfloat16:
        from .convert import np_dtype

        return t.view(torch.int16).numpy().view(np_dtype(torch.bfloat16))
    return t.numpy()  # shares memory, strides included


def _to_torch(a: Any) -> Any:
    import torch

    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)
    if not a.flags.writeable or any(s < 0 for s in a.strides) or a.dtype == np.dtype(object):
        a = np.array(a)  # read-only (a constant, a mapped weight) or a layout torch cannot view
    try:
        return torch.from_numpy(a)
    except (TypeError, ValueError):
        return torch.from_numpy(np.array(a))
