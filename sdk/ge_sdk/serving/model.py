"""A compiled .om as a KServe model: :class:`GeModel` answers the Open Inference Protocol (KServe v2)
through ``kserve.ModelServer`` (``ge serve``) or any server built on ``kserve.Model`` (the Ray Serve
deployment of ``ge_ray``).

Importing this module imports kserve (the ``serve`` extra); without it the import raises an
:class:`OptionError` that says what to install. ``ge_sdk`` itself never imports this module, so the
CLI and the SDK load without kserve.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ge_core.errors import InputError, OptionError


@contextlib.contextmanager
def _argv_hidden() -> Iterator[None]:
    """kserve.model_server parses ``sys.argv`` when imported (``parse_known_args``, abbreviations
    allowed: ``--timeout`` would set its keep-alive timeout): let it see no arguments."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


try:
    with _argv_hidden():
        import kserve
        from kserve.errors import InvalidInput
        from kserve.protocol.grpc.grpc_predict_v2_pb2 import ModelInferRequest
        from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
except ImportError as e:  # pragma: no cover - the serve extra is installed in CI
    raise OptionError(f"serving a model needs kserve, which is not installed ({e})",
                      hint="pip install 'ge-python[serve]'") from e

from .batcher import Batcher  # noqa: E402  (after kserve's import check)

#: NumPy dtype -> the protocol's datatype (v2 "Tensor Data Types").
V2_DATATYPES = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "UINT8", np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32", np.dtype(np.uint64): "UINT64", np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64",
    np.dtype(object): "BYTES",
}


def v2_datatype(dtype: np.dtype | None) -> str:
    """The protocol's name of ``dtype`` (``FP32``...); ``BYTES`` for strings and unknown types."""
    if dtype is None:
        return "BYTES"
    return V2_DATATYPES.get(np.dtype(dtype), "BF16" if np.dtype(dtype).name == "bfloat16" else "BYTES")


def v2_shape(shape: tuple[int | str, ...] | None) -> list[int]:
    """A shape as the protocol writes it: symbolic (and gear) dims as -1; ``[]`` for an unknown rank."""
    return [d if isinstance(d, int) else -1 for d in (shape or ())]


def batch_axes(model: Any) -> tuple[dict[str, int] | None, dict[str, int] | None]:
    """``(input axes, output axes)`` of the batch dim the batcher may concatenate along: a symbolic
    first dim shared by every fed input (a gear model's ``batch`` too) and leading every output
    (by the same symbol, or a dim that differs between gears); ``(None, None)`` otherwise."""
    defaults = set(getattr(model, "input_defaults", {}) or {})
    fed = [a for a in model.inputs if a.name not in defaults]
    if not fed or any(not a.shape for a in fed):
        return None, None
    first = {a.shape[0] for a in fed}  # type: ignore[index]
    sym = next(iter(first))
    if len(first) != 1 or not isinstance(sym, str) or sym == "?":
        return None, None
    outs = model.outputs
    if not outs or any(not o.shape or o.shape[0] not in (sym, "?") for o in outs):
        return None, None
    return {a.name: 0 for a in fed}, {o.name: 0 for o in outs}


def gear_rows(model: Any, axes: dict[str, int] | None) -> list[int]:
    """The batch sizes of a gear model's gears (``atc --dynamic_batch_size``), ascending; [] for a
    model without gears or without a batch dim."""
    gears = getattr(model, "models", None)
    if not gears or not axes:
        return []
    name = next(iter(axes))
    rows = {d for g in gears for a in g.inputs if a.name == name and a.shape for d in a.shape[:1]}
    return sorted(r for r in rows if isinstance(r, int))


def warmup_feeds(model: Any) -> dict[str, np.ndarray]:
    """Zero feeds of the smallest shape ``model`` takes: symbolic dims at the low end of their
    compiled range (1 when unbounded), strings empty; inputs with defaults left out."""
    ranges = getattr(model, "dim_ranges", {}) or {}
    defaults = set(getattr(model, "input_defaults", {}) or {})
    feeds = {}
    for a in model.inputs:
        if a.name in defaults:
            continue
        dims = [d if isinstance(d, int) else max(1, (ranges.get(d) or (1,))[0]) for d in (a.shape or ())]
        dtype = a.dtype if a.dtype is not None else np.dtype(np.float32)
        feeds[a.name] = np.full(dims, "", dtype=object) if dtype == np.dtype(object) else np.zeros(dims, dtype)
    return feeds


class GeModel(kserve.Model):
    """One compiled .om served over the Open Inference Protocol.

    ``source``: an .om path (loaded by :meth:`load`) or a loaded model; ``name``: the model's name
    on the endpoints (default: the file's stem). ``threads``: the threads of one run;
    ``max_batch`` / ``max_delay_ms`` / ``max_queue`` / ``timeout_s`` / ``workers``: the
    :class:`~ge_sdk.serving.batcher.Batcher` the requests go through (batching along the model's
    batch dim where it has one). :meth:`load` loads the model once and runs it on zero feeds;
    the model is ready after that warm-up.
    """

    def __init__(self, source: str | os.PathLike | Any, name: str | None = None, *, threads: int | None = None,
                 max_batch: int = 1, max_delay_ms: float = 0.0, max_queue: int = 64,
                 timeout_s: float | None = None, workers: int = 1) -> None:
        path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
        if name is None:
            name = os.path.splitext(os.path.basename(path))[0] if path else getattr(getattr(source, "graph", None), "name", "model")
        super().__init__(name)
        self.path = path
        self.model: Any = None if path else source
        self.threads = threads
        self.batching: dict[str, Any] = dict(max_batch=max_batch, max_delay_ms=max_delay_ms, max_queue=max_queue,
                             timeout_s=timeout_s, workers=workers)
        self.batcher: Batcher | None = None
        self.gear_rows: list[int] = []

    # -- loading -------------------------------------------------------------------------------
    def load(self) -> bool:
        """Load the .om (once), build the batcher, run every gear once on zero feeds; then ready."""
        if self.model is None:
            import ge_core

            self.model = ge_core.load_om(self.path, threads=self.threads)  # type: ignore[arg-type]
        elif self.threads is not None:
            self.model.set_run_options(threads=self.threads)
        m = self.model
        self.inputs = {a.name: a for a in m.inputs}
        self.outputs = {o.name: o for o in m.outputs}
        in_axes, out_axes = batch_axes(m)
        opts: dict[str, Any] = dict(self.batching)
        if in_axes is not None:
            sym = next(a.shape[0] for a in m.inputs if a.name in in_axes)
            hi = (getattr(m, "dim_ranges", {}) or {}).get(sym, (1, None))[1]
            if hi is not None:
                opts["max_batch"] = max(1, min(opts["max_batch"], hi))
        self.gear_rows = gear_rows(m, in_axes)
        if self.gear_rows:
            opts["max_batch"] = max(1, min(opts["max_batch"], self.gear_rows[-1]))
        self.batcher = Batcher(self._run, batch_axes=in_axes, output_axes=out_axes, model_name=self.name, **opts)
        for gear in getattr(m, "models", [m]):  # a gear model: every gear's executable is built now
            gear.run(warmup_feeds(gear))
        self.ready = True
        return True

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a batch; on a gear model, rows between gears are padded with zero rows up to the
        next gear and the outputs cut back (a batch of 3 on gears 1, 2, 4 runs the gear 4)."""
        axes = self.batcher.batch_axes if self.batcher is not None else {}
        if self.gear_rows and axes:
            rows = feeds[next(iter(axes))].shape[0]
            fit = next((g for g in self.gear_rows if g >= rows), rows)
            if fit != rows:
                padded = {k: np.concatenate([v, np.zeros((fit - rows, *v.shape[1:]), v.dtype)]) if k in axes else v
                          for k, v in feeds.items()}
                return {k: v[:rows] for k, v in self.model.run(padded).items()}
        return self.model.run(feeds)

    # -- metadata ------------------------------------------------------------------------------
    def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": a.name, "datatype": v2_datatype(a.dtype), "shape": v2_shape(a.shape)}
                for a in self.model.inputs]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [{"name": o.name, "datatype": v2_datatype(o.dtype), "shape": v2_shape(o.shape)}
                for o in self.model.outputs]

    # -- inference -----------------------------------------------------------------------------
    def decode(self, request: InferRequest) -> dict[str, np.ndarray]:
        """The request's tensors as feeds, checked against the model: InvalidInput (HTTP 400)
        naming the input and what the model expects for an unknown, missing or repeated input, a
        wrong datatype or shape, or data that does not fill the shape."""
        feeds: dict[str, np.ndarray] = {}
        takes = ", ".join(f"{a.name} {v2_datatype(a.dtype)}{v2_shape(a.shape)}" for a in self.inputs.values())
        for t in request.inputs:
            want = self.inputs.get(t.name)
            if want is None:
                raise InvalidInput(f"model '{self.name}' has no input '{t.name}'; it takes {takes}")
            if t.name in feeds:
                raise InvalidInput(f"input '{t.name}' is given twice")
            expect, dtype = v2_datatype(want.dtype), t.datatype
            if want.dtype is not None and dtype != expect:
                raise InvalidInput(f"input '{t.name}' has datatype {dtype}, model '{self.name}' expects {expect}")
            shape, wshape = list(t.shape), v2_shape(want.shape)
            if want.shape is not None and (len(shape) != len(wshape) or any(
                    w != -1 and s != w for s, w in zip(shape, wshape))):
                raise InvalidInput(f"input '{t.name}' has shape {shape}, model '{self.name}' expects {wshape} "
                                   "(-1: any size)")
            try:
                a = t.as_numpy()
            except (ValueError, TypeError) as e:
                raise InvalidInput(f"input '{t.name}': its data does not fill the shape {shape} of datatype "
                                   f"{dtype} ({e})") from None
            if want.dtype is not None and want.dtype != np.dtype(object) and a.dtype != want.dtype:
                a = a.astype(want.dtype)
            feeds[t.name] = a
        defaults = set(getattr(self.model, "input_defaults", {}) or {})
        missing = [n for n in self.inputs if n not in feeds and n not in defaults]
        if missing:
            raise InvalidInput(f"missing input(s) {', '.join(repr(n) for n in missing)} of model '{self.name}'; "
                               f"it takes {takes}")
        if self.batcher is None or not self.batcher.batching or not hasattr(self.model, "models"):
            try:  # symbols agreeing across inputs, dims in the compiled range (a gear model's
                self.model.check_feeds(feeds)  # batched rows are checked when the batch runs)
            except InputError as e:
                raise InvalidInput(f"model '{self.name}': {e}") from None
        return feeds

    def requested(self, request: InferRequest) -> None:
        """InvalidInput for a requested output the model does not have."""
        for r in request.request_outputs or ():
            if r.name not in self.outputs:
                raise InvalidInput(f"model '{self.name}' has no output '{r.name}'; its outputs are "
                                   f"{', '.join(self.outputs)}")

    async def predict(self, payload: Any, headers: Mapping[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> InferResponse:
        """Check the request, run it through the batcher, answer the model's outputs (the
        requested ones; binary where the request asks: kserve encodes the response)."""
        if not self.ready or self.batcher is None:
            raise kserve.errors.ModelNotReady(self.name)
        request = InferRequest.from_grpc(payload) if isinstance(payload, ModelInferRequest) else payload
        if not isinstance(request, InferRequest):
            raise InvalidInput(f"model '{self.name}' takes Open Inference Protocol (v2) requests")
        rid = (headers or {}).get("x-request-id") or request.id or uuid.uuid4().hex
        feeds = self.decode(request)
        self.requested(request)
        try:
            outs = await self.batcher.submit(feeds, request_id=rid)
        except InputError as e:
            raise InvalidInput(f"model '{self.name}': {e}") from None
        outputs = []
        wanted = {r.name for r in request.request_outputs or ()}
        for name, a in outs.items():
            a = np.asarray(a)
            if a.dtype.kind in "US":
                a = a.astype(object)
            out = InferOutput(name=name, shape=list(a.shape), datatype=v2_datatype(a.dtype), data=a)
            if request.from_grpc:  # gRPC answers the requested outputs, as raw contents (kserve's
                if wanted and name not in wanted:  # to_grpc does not select and fails on raw arrays)
                    continue
                out.set_data_from_numpy(a, binary_data=True)
            outputs.append(out)
        return InferResponse(response_id=request.id or rid, model_name=self.name, infer_outputs=outputs,
                             use_binary_outputs=request.use_binary_outputs,
                             requested_outputs=request.request_outputs, from_grpc=request.from_grpc)


__all__ = ["GeModel", "batch_axes", "gear_rows", "v2_datatype", "v2_shape", "warmup_feeds"]
