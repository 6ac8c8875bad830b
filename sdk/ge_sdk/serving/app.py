"""The Open Inference Protocol (KServe v2) app of ``ge serve`` and of ``ge_ray``'s Ray Serve
deployment: kserve's REST pieces (its DataPlane, v1/v2 endpoints, error handlers, ``/metrics``)
on a FastAPI app of their own, with what a server facing users needs around them: a request id
per request (``X-Request-Id``, echoed back) and one JSON log line with it, bearer-token auth
(health stays open), a body size limit (413), draining (503 once :class:`State` says so),
malformed requests as 400, the batcher's back-pressure as 429/503/504, and binary tensors read
with ``np.frombuffer``. Each server runs the app its own way (uvicorn, Ray Serve's proxy).

It also holds the command-line flags both commands share (:func:`add_server_flags`). kserve is
imported when an app is built (through :mod:`ge_sdk.serving.model`, which hides ``sys.argv`` from
kserve's parser and says what to install without it), so ``ge --help`` stays cheap."""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from ge_core.errors import OptionError

from .batcher import QueueFull, RequestTimeout, ShuttingDown

LOG = logging.getLogger("ge.serve")
#: Paths answered without a token (Kubernetes probes).
OPEN_PATHS = frozenset({"/", "/v2/health/live", "/v2/health/ready"})
#: Loggers whose lines are written as JSON.
LOGGERS = ("ge.serve", "kserve", "kserve.trace", "uvicorn", "uvicorn.error")
#: The default body limit (64 MiB).
MAX_BODY = 64 * 2**20


def _kserve() -> None:
    """Import kserve through GeModel's module first: it hides ``sys.argv`` from kserve's parser
    and raises an OptionError naming the extra to install without kserve."""
    from . import model  # noqa: F401


# -- the flags of ge serve and ge serve-ray --------------------------------------------------------
def add_server_flags(p: argparse.ArgumentParser, *, per: str = "model") -> None:
    """The flags ``ge serve`` and ``ge serve-ray`` share: the port, each model's dynamic batcher
    (``per``: what one batcher serves, e.g. "model and replica"), the token and the body limit."""
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    p.add_argument("--max-batch", type=int, default=1,
                   help=f"most rows the dynamic batcher joins along the model's batch dim, per {per} "
                        "(default 1: no batching)")
    p.add_argument("--max-delay-ms", type=float, default=0.0,
                   help="longest wait for more requests after a batch's first one (default 0)")
    p.add_argument("--max-queue", type=int, default=64, help=f"most requests waiting per {per}; more get 429 (default 64)")
    p.add_argument("--timeout", type=float, default=None, help="seconds a request may wait in the queue (504 after)")
    p.add_argument("--token", default=None,
                   help="require 'Authorization: Bearer TOKEN' (default: $GE_SERVE_TOKEN; health stays open)")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MiB (default 64; 413 above)")


def check_server_flags(args: argparse.Namespace) -> str | None:
    """An OptionError naming the first flag of :func:`add_server_flags` out of its range; else the
    bearer token to require (``--token``, else ``$GE_SERVE_TOKEN``, else None)."""
    for flag, v, low in (("--port", args.port, 0), ("--max-batch", args.max_batch, 1), ("--max-queue", args.max_queue, 1)):
        if v < low or (flag == "--port" and v > 65535):
            raise OptionError(f"{flag} {v} is out of range", hint=f"give an integer of at least {low}"
                              + (" and at most 65535" if flag == "--port" else ""))
    if not args.max_delay_ms >= 0:
        raise OptionError(f"--max-delay-ms {args.max_delay_ms} must be at least 0")
    for flag, f in (("--max-body-mb", args.max_body_mb), ("--timeout", args.timeout)):
        if f is not None and not f > 0:
            raise OptionError(f"{flag} {f} must be more than 0")
    return args.token or os.environ.get("GE_SERVE_TOKEN") or None


# -- logging ---------------------------------------------------------------------------------------
class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                             "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        d.update(getattr(record, "fields", {}))
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d, default=str)


def json_logging() -> None:
    """Every server log line as JSON on stderr (kserve configured its loggers' handlers already);
    kserve's two timing lines per request are left out (the middleware writes one)."""
    fmt = JsonFormatter()
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
    access = logging.getLogger("uvicorn.access")  # uvicorn's access lines: the middleware writes one
    access.handlers, access.propagate = [], False
    if not LOG.handlers:
        LOG.addHandler(logging.StreamHandler())
        LOG.setLevel(logging.INFO)
        LOG.propagate = False
    for name in LOGGERS:
        for h in logging.getLogger(name).handlers:
            h.setFormatter(fmt)


class State:
    """What the middleware and the server's signal handler share."""

    draining = False


async def _reply(send: Any, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class ServeMiddleware:
    """The ASGI middleware in front of kserve's endpoints: request id, auth, draining, body limit,
    the content type of ``/infer`` requests, one log line per request."""

    def __init__(self, app: Any, *, token: str | None, max_body: int, state: State) -> None:
        self.app, self.token, self.max_body, self.state = app, token, max_body, state

    def refusal(self, scope: dict[str, Any], headers: dict[bytes, bytes]) -> tuple[int, str, list] | None:
        path = scope.get("path", "")
        if self.token and path not in OPEN_PATHS:
            got = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
                what = "wrong bearer token" if got else "no bearer token (header 'Authorization: Bearer TOKEN')"
                return 401, f"unauthorized: {what}", [(b"www-authenticate", b"Bearer")]
        if self.state.draining and (path.endswith("/infer") or path == "/v2/health/ready"):
            return 503, "the server is shutting down; send the request to another replica", [(b"retry-after", b"1")]
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return 413, self.too_large(int(length)), []
        return None

    def too_large(self, n: int | None) -> str:
        """The 413 message for a body of ``n`` bytes (None: a chunked body past the limit)."""
        return (f"request body {'' if n is None else f'of {n} bytes '}is over the limit of {self.max_body} bytes "
                "(--max-body-mb of ge serve / ge serve-ray; or send the tensors in binary)")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or uuid.uuid4().hex
        if b"x-request-id" not in headers:
            scope = {**scope, "headers": [*scope.get("headers", []), (b"x-request-id", rid.encode())]}
        if scope.get("path", "").endswith("/infer"):
            # the binary-data header decides, whatever the content type says (tritonclient sends
            # none: kserve would take a JSON body for binary data without its JSON length)
            kind = b"application/octet-stream" if b"inference-header-content-length" in headers else b"application/json"
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                     + [(b"content-type", kind)]}
        status = [0]

        async def send_(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                kept = [(k, v) for k, v in msg.get("headers", []) if k.lower() != b"x-request-id"]
                msg = {**msg, "headers": [*kept, (b"x-request-id", rid.encode("latin-1"))]}
            await send(msg)

        try:
            problem = self.refusal(scope, headers)
            if problem is None and scope.get("method") in ("POST", "PUT"):
                body, more = b"", True
                while more:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return
                    body += msg.get("body", b"")
                    more = msg.get("more_body", False)
                    if len(body) > self.max_body:
                        problem = 413, self.too_large(None), []
                        break
                receive = _replay(body, receive)
            if problem is not None:
                await _reply(send_, problem[0], problem[1], problem[2])
            else:
                await self.app(scope, receive, send_)
        finally:
            LOG.info("request", extra={"fields": {
                "request_id": rid, "method": scope.get("method"), "path": scope.get("path"), "status": status[0],
                "ms": round((time.perf_counter() - t0) * 1e3, 3)}})


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` giving ``body`` once, then what ``receive`` gives (the disconnect)."""
    sent = [False]

    async def again() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def add_handlers(app: Any) -> None:
    """kserve's error statuses, the batcher's refusals and requests kserve cannot parse (FastAPI
    would say 422 or 500) as HTTP statuses with ``{"error": message}``."""
    _kserve()
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve import errors

    for exc, known in ((errors.InferenceError, errors.inference_error_handler),
                       (errors.ModelNotFound, errors.model_not_found_handler),
                       (errors.ModelNotReady, errors.model_not_ready_handler),
                       (NotImplementedError, errors.not_implemented_error_handler),
                       (errors.UnsupportedProtocol, errors.unsupported_protocol_error_handler),
                       (errors.ServerNotLive, errors.server_not_live_handler),
                       (errors.ServerNotReady, errors.server_not_ready_handler),
                       (Exception, errors.generic_exception_handler)):
        app.add_exception_handler(exc, known)

    def handler(status: int, retry: bool = False) -> Any:
        async def handle(_request: Any, exc: Exception) -> JSONResponse:
            headers = {"retry-after": str(getattr(exc, "retry_after", 1))} if retry else None
            return JSONResponse(status_code=status, content={"error": str(exc)}, headers=headers)
        return handle

    async def malformed(_request: Any, exc: Exception) -> JSONResponse:
        found: list[Any] = getattr(exc, "errors", list)()
        what = "; ".join(f"{'/'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in found[:5])
        return JSONResponse(status_code=400, content={"error": f"malformed request (not a v2 inference request "
                                                               f"in JSON): {what or exc}"})

    async def bad_value(_request: Any, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=400, content={"error": f"bad request: {exc}"})

    async def invalid(_request: Any, exc: Exception) -> JSONResponse:
        LOG.warning("bad request", extra={"fields": {"error": str(exc)}})  # kserve's handler logs a traceback
        return JSONResponse(status_code=400, content={"error": str(exc)})

    app.add_exception_handler(errors.InvalidInput, invalid)
    app.add_exception_handler(QueueFull, handler(429, retry=True))
    app.add_exception_handler(RequestTimeout, handler(504))
    app.add_exception_handler(ShuttingDown, handler(503, retry=True))
    app.add_exception_handler(RequestValidationError, malformed)
    app.add_exception_handler(KeyError, bad_value)  # a tensor without name/shape/datatype (binary requests)
    app.add_exception_handler(ValueError, bad_value)  # data that does not fill its shape (binary requests)


def binary_dataplane(registry: Any) -> Any:
    """kserve's DataPlane over ``registry`` whose binary requests keep each tensor's bytes as they
    came (kserve's own ``InferRequest.from_bytes`` turns them into a Python list of numbers and
    back: milliseconds per 100k values); the tensors are then read with ``np.frombuffer``."""
    _kserve()
    import orjson
    from kserve.errors import InvalidInput
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

    class BinaryDataPlane(DataPlane):
        def decode_inference_request(self, body: Any, headers: Any, model_name: str) -> Any:
            size = headers.get("inference-header-content-length") if isinstance(body, bytes) else None
            if size is None or not size.isdigit():
                return super().decode_inference_request(body, headers, model_name)
            try:
                req = orjson.loads(body[:int(size)])
                start, inputs, raw = int(size), [], []  # type: tuple[int, list[Any], list[bytes | None]]
                for t in req["inputs"]:
                    params = t.get("parameters") or {}
                    inp = InferInput(name=t["name"], shape=t["shape"], datatype=t["datatype"], parameters=params)
                    n = params.get("binary_data_size")
                    if t.get("data") is not None:
                        inp.data = t["data"]
                        raw.append(None)
                    elif isinstance(n, int) and 0 <= n <= len(body) - start:
                        raw.append(body[start:start + n])
                        start += n
                    else:
                        raise InvalidInput(f"input '{t['name']}' has neither 'data' nor a 'binary_data_size' "
                                           "inside the request's binary part")
                    inputs.append(inp)
                outs = [RequestedOutput(name=o["name"], parameters=o.get("parameters")) for o in req.get("outputs") or ()]
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise InvalidInput(f"malformed binary inference request: {type(e).__name__}: {e}") from None
            return InferRequest(model_name=model_name, infer_inputs=inputs, request_id=req.get("id"), raw_inputs=raw,
                                parameters=req.get("parameters"), request_outputs=outs or None)

    return BinaryDataPlane(model_registry=registry)


def model_repository(models: Iterable[Any] = ()) -> Any:
    """A ``kserve.ModelRepository`` holding ``models`` (kserve models), each under its name."""
    _kserve()
    from kserve.model_repository import ModelRepository

    repository = ModelRepository()
    for m in models:
        repository.update(m)
    return repository


def kserve_app(repository_or_models: Any | Iterable[Any], *, token: str | None = None, max_body: int = MAX_BODY,
               state: State | None = None) -> Any:
    """The Open Inference Protocol over ``repository_or_models`` (a ``kserve.ModelRepository``, or
    models, each registered under its name) as a FastAPI app: kserve's ``/``, ``/metrics``, v1
    and v2 endpoints on :func:`binary_dataplane`, the statuses of :func:`add_handlers`, behind
    :class:`ServeMiddleware` (``token``: required as ``Authorization: Bearer``, None for none;
    ``max_body``: bytes; ``state``: draining, shared with the server's signal handling). The
    models are served as they are: load them first. ``app.state`` holds ``repository``,
    ``dataplane`` and ``extension`` (kserve's, for a gRPC servicer on the same models)."""
    _kserve()
    from fastapi import FastAPI
    from kserve.model_repository import ModelRepository
    from kserve.protocol.model_repository_extension import ModelRepositoryExtension
    from kserve.protocol.rest.server import metrics_handler
    from kserve.protocol.rest.v1_endpoints import register_v1_endpoints
    from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

    repository = (repository_or_models if isinstance(repository_or_models, ModelRepository)
                  else model_repository(repository_or_models))
    app = FastAPI(title="GE models (Open Inference Protocol)", docs_url=None, redoc_url=None)
    dataplane = binary_dataplane(repository)
    extension = ModelRepositoryExtension(model_registry=repository)
    app.add_api_route("/", dataplane.live)
    app.add_api_route("/metrics", metrics_handler, methods=["GET"])
    register_v1_endpoints(app, dataplane, extension)
    register_v2_endpoints(app, dataplane, extension)
    add_handlers(app)
    app.add_middleware(ServeMiddleware, token=token or None, max_body=int(max_body), state=state or State())
    app.state.repository, app.state.dataplane, app.state.extension = repository, dataplane, extension
    return app


__all__ = ["JsonFormatter", "add_server_flags", "check_server_flags", "MAX_BODY", "OPEN_PATHS", "ServeMiddleware", "State", "add_handlers", "binary_dataplane",
           "json_logging", "kserve_app",
           "model_repository"]
