"""``ge serve``'s server: the models in kserve's ModelServer (its model registry, event loop and
gRPC servicer), the REST app of :func:`ge_sdk.serving.app.kserve_app` (kserve's v2 endpoints and
``/metrics`` with bearer-token auth, body limit, request ids and JSON log lines, the 4xx/5xx of
bad requests and back-pressure; shared with ge_ray's Ray Serve deployment) on one uvicorn server
bound to the host asked for, and a draining SIGTERM (new requests get 503, every request the
batchers accepted is answered, then the process exits 0)."""

from __future__ import annotations

import asyncio
import hmac
import signal
import time
from collections.abc import Sequence
from typing import Any

from ge_sdk.serving.app import LOG, State, json_logging, kserve_app
from ge_sdk.serving.model import GeModel


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

    ms = ModelServer(http_port=port, grpc_port=grpc_port or 0, enable_grpc=False, enable_latency_logging=False,
                     grace_period=grace_s)
    json_logging()
    for m in models:
        t0 = time.perf_counter()
        m.load()
        ms.register_model(m)
        LOG.info("model ready", extra={"fields": {"model": m.name, "path": m.path, "load_s": round(time.perf_counter() - t0, 3),
                                                  "batch_axes": m.batcher.batch_axes if m.batcher else None}})
    state = State()
    app = kserve_app(ms.registered_models, token=token, max_body=int(max_body_mb * 2**20), state=state)
    ms.dataplane = app.state.dataplane  # gRPC through the same data plane
    # uvicorn as kserve's RESTServer configures it (logging is kserve's), bound to ``host``
    config = uvicorn.Config(app, host=host, port=port, log_config=None, timeout_graceful_shutdown=grace_s,
                            timeout_keep_alive=65)

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

    server = DrainingServer(config)

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
