"""``ge serve``'s server: kserve's ModelServer (its data plane, model registry, REST app with the v2
endpoints, gRPC servicer and ``/metrics``) run on one uvicorn server bound to the host asked for,
with what a server facing users needs around it: bearer-token auth (health stays open), a body
size limit (413), malformed requests as 400, back-pressure as 429/503/504, one JSON log line per
request with its request id (``X-Request-Id``, echoed back), and a draining SIGTERM (new requests
get 503, every request the batchers accepted is answered, then the process exits 0)."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import time
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

from ge_sdk.serving.batcher import QueueFull, RequestTimeout, ShuttingDown
from ge_sdk.serving.model import GeModel

LOG = logging.getLogger("ge.serve")
#: Paths answered without a token (Kubernetes probes).
OPEN_PATHS = frozenset({"/", "/v2/health/live", "/v2/health/ready"})
#: Loggers whose lines are written as JSON.
LOGGERS = ("ge.serve", "kserve", "kserve.trace", "uvicorn", "uvicorn.error")


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
    warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")  # kserve's app, once per process
    if not LOG.handlers:
        LOG.addHandler(logging.StreamHandler())
        LOG.setLevel(logging.INFO)
        LOG.propagate = False
    for name in LOGGERS:
        for h in logging.getLogger(name).handlers:
            h.setFormatter(fmt)


class State:
    """What the middleware and the signal handler share."""

    draining = False


async def _reply(send: Any, status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class ServeMiddleware:
    """The ASGI middleware in front of kserve's app: request id, auth, draining, body limit, log line."""

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
                "(ge serve --max-body-mb; or send the tensors in binary)")

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
    """HTTP statuses for the batcher's refusals and for requests kserve cannot parse (FastAPI
    would say 422 or 500)."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve.errors import InvalidInput

    def handler(status: int, retry: bool = False) -> Any:
        async def handle(_request: Any, exc: Exception) -> JSONResponse:
            headers = {"retry-after": str(getattr(exc, "retry_after", 1))} if retry else None
            return JSONResponse(status_code=status, content={"error": str(exc)}, headers=headers)
        return handle

    async def malformed(_request: Any, exc: Exception) -> JSONResponse:
        errors: list[Any] = getattr(exc, "errors", list)()
        what = "; ".join(f"{'/'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors[:5])
        return JSONResponse(status_code=400, content={"error": f"malformed request (not a v2 inference request "
                                                               f"in JSON): {what or exc}"})

    async def bad_value(_request: Any, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=400, content={"error": f"bad request: {exc}"})

    async def invalid(_request: Any, exc: Exception) -> JSONResponse:
        LOG.warning("bad request", extra={"fields": {"error": str(exc)}})  # kserve's handler logs a traceback
        return JSONResponse(status_code=400, content={"error": str(exc)})

    app.add_exception_handler(InvalidInput, invalid)
    app.add_exception_handler(QueueFull, handler(429, retry=True))
    app.add_exception_handler(RequestTimeout, handler(504))
    app.add_exception_handler(ShuttingDown, handler(503, retry=True))
    app.add_exception_handler(RequestValidationError, malformed)
    app.add_exception_handler(KeyError, bad_value)  # a tensor without name/shape/datatype (binary requests)
    app.add_exception_handler(ValueError, bad_value)  # data that does not fill its shape (binary requests)


def _dataplane(registry: Any) -> Any:
    """kserve's DataPlane whose binary requests keep each tensor's bytes as they came (kserve's own
    ``InferRequest.from_bytes`` turns them into a Python list of numbers and back: milliseconds
    per 100k values); the tensors are then read with ``np.frombuffer``."""
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


def _grpc_server(ms: Any, host: str, port: int, token: str | None) -> Any:
    """kserve's gRPC servicer on ``host:port`` (kserve's own GRPCServer binds every interface)."""
    import grpc
    from grpc import aio
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
    from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
    from kserve.protocol.grpc.servicer import InferenceServicer

    class TokenInterceptor(aio.ServerInterceptor):
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            meta = dict(details.invocation_metadata or ())
            if token is None or hmac.compare_digest(str(meta.get("authorization", "")), f"Bearer {token}"):
                return await continuation(details)

            async def deny(_request: Any, context: Any) -> None:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no or wrong bearer token")
            return grpc.unary_unary_rpc_method_handler(deny)

    server = aio.server(interceptors=(TokenInterceptor(), ExceptionToStatusInterceptor()))
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceServicer(ms.dataplane, ms.model_repository_extension), server)
    server.add_insecure_port(f"{host}:{port}")
    return server


def serve(models: Sequence[GeModel], *, host: str = "127.0.0.1", port: int = 8080, grpc_port: int | None = None,
          token: str | None = None, max_body_mb: float = 64.0, grace_s: int = 30) -> int:
    """Load and warm ``models``, serve them until SIGTERM/SIGINT, drain; returns the exit status 0."""
    import uvicorn
    from kserve import ModelServer
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
    from kserve.model_server import app
    from kserve.protocol.rest.server import RESTServer

    ms = ModelServer(http_port=port, grpc_port=grpc_port or 0, enable_grpc=False, enable_latency_logging=False,
                     grace_period=grace_s)
    json_logging()
    ms.dataplane = _dataplane(ms.registered_models)
    for m in models:
        t0 = time.perf_counter()
        m.load()
        ms.register_model(m)
        LOG.info("model ready", extra={"fields": {"model": m.name, "path": m.path, "load_s": round(time.perf_counter() - t0, 3),
                                                  "batch_axes": m.batcher.batch_axes if m.batcher else None}})
    rest = RESTServer(FASTAPI_APP_IMPORT_STRING, ms.dataplane, ms.model_repository_extension, port, grace_period=grace_s)
    rest.config.host = host  # kserve's RESTServer binds 0.0.0.0
    rest.create_application()
    state = State()
    app.add_middleware(ServeMiddleware, token=token, max_body=int(max_body_mb * 2**20), state=state)
    add_handlers(app)

    class DrainingServer(uvicorn.Server):
        """uvicorn, whose first SIGTERM/SIGINT drains the batchers before the graceful shutdown."""

        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if state.draining or self.loop is None:
                self.should_exit = True
                self.force_exit = self.force_exit or (state.draining and sig == signal.SIGINT)
                return
            state.draining = True
            LOG.info("draining", extra={"fields": {"signal": signal.Signals(sig).name}})
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self.drain()))  # type: ignore[union-attr]

        async def drain(self) -> None:
            try:
                await asyncio.gather(*(m.batcher.drain() for m in models if m.batcher is not None))
            finally:
                self.should_exit = True

    server = DrainingServer(rest.config)

    async def main() -> None:
        ms.setup_event_loop()
        grpc_server = _grpc_server(ms, host, grpc_port, token) if grpc_port else None  # on this loop
        if grpc_server is not None:
            await grpc_server.start()
        LOG.info("serving", extra={"fields": {"host": host, "port": port, "grpc_port": grpc_port,
                                              "models": [m.name for m in models], "auth": bool(token)}})
        try:
            await server.serve()
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grace=grace_s)
        LOG.info("stopped", extra={"fields": {}})

    asyncio.run(main())
    return 0
