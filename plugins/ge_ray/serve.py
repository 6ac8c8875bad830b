"""A Ray Serve deployment of compiled .om models speaking the Open Inference Protocol (KServe v2),
the protocol of ``ge serve``.

kserve 0.21's ModelServer no longer hosts Ray Serve handles, so the deployment is the other way
round: each replica holds a ``kserve.ModelRepository`` of :class:`ge_sdk.serving.model.GeModel`
(the model adapter of ``ge serve``: validation, the dynamic batcher, metadata) and its ingress is
an ASGI app assembled from kserve's own REST pieces (its DataPlane, v1/v2 endpoints, error
handlers, ``/metrics``), built inside the replica once the models are loaded and warmed up. Ray
Serve's HTTP proxy routes to the replicas and scales their number on queue length
(``target_ongoing_requests`` per replica, between ``min_replicas`` and ``max_replicas``).

    from ray import serve
    import ge_ray
    serve.run(ge_ray.serve_app(["resnet.om"], threads=4, max_replicas=8), route_prefix="/")
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from ray import serve

from ge_core import ModelFileError, OptionError


def model_table(model_paths: str | os.PathLike | Sequence[str | os.PathLike],
                names: Sequence[str] | None = None, *, local: bool = True) -> list[tuple[str, str]]:
    """``[(name, path)]`` of the models to serve: a name per path (default: the file's stem),
    unique. ``local``: the paths are on this machine (a missing one is a ModelFileError); else
    they are the cluster nodes' paths and only the replicas can check them."""
    given = [model_paths] if isinstance(model_paths, (str, os.PathLike)) else list(model_paths)
    if not given or not all(isinstance(p, (str, os.PathLike)) for p in given):
        raise OptionError(f"serve_app({model_paths!r:.60}): give one or more .om paths", hint="e.g. ['model.om']")
    paths = [os.fspath(p) for p in given]
    if names is None:
        names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    names = list(names)
    if len(names) != len(paths) or not all(isinstance(n, str) and n for n in names):
        raise OptionError(f"{len(names)} name(s) for {len(paths)} model(s): give one non-empty name per model",
                          hint="or leave the names out to use the files' stems")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OptionError(f"two models are named {dup[0]!r}: a model's name is its URL (/v2/models/<name>)",
                          hint="give distinct names")
    table = []
    for n, p in zip(names, paths):
        if local:
            if not os.path.isfile(p):
                raise ModelFileError(f"{p}: no such .om file (model '{n}')", hint="check the path")
            p = os.path.abspath(p)
        table.append((n, p))
    return table


def ge_model_class() -> Any:
    """``ge_sdk.serving.model.GeModel``, the model adapter of ``ge serve``. Its module imports kserve,
    whose model server parses ``sys.argv`` when imported, with the arguments hidden: it is imported
    before any kserve module here."""
    from ge_sdk.serving.model import ge_model_class as cls

    return cls()


class InferContentType:
    """ASGI middleware: an ``/infer`` request's content type follows the binary-data header (as in
    ``ge serve``). tritonclient sends no content type, and FastAPI would then hand kserve a JSON
    body as bytes, which kserve refuses for want of the binary header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").endswith("/infer"):
            headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != b"content-type"]
            binary = any(k.lower() == b"inference-header-content-length" for k, _ in headers)
            kind = b"application/octet-stream" if binary else b"application/json"
            scope = {**scope, "headers": [*headers, (b"content-type", kind)]}
        await self.app(scope, receive, send)


def kserve_app(repository: Any) -> Any:
    """The Open Inference Protocol over ``repository`` (a ``kserve.ModelRepository``) as a
    FastAPI app built from kserve's REST server pieces. As ``ge serve``: the batcher's refusals answer 429
    (queue full, with ``Retry-After``), 504 (queued past the request timeout) and 503 (shutting down),
    a body that is no v2 request 400 (FastAPI would say 422, or 500 for binary data kserve cannot decode)."""
    ge_model_class()  # first: kserve is imported with sys.argv hidden from its parser
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from kserve import errors
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.model_repository_extension import ModelRepositoryExtension
    from kserve.protocol.rest.server import metrics_handler
    from kserve.protocol.rest.v1_endpoints import register_v1_endpoints
    from kserve.protocol.rest.v2_endpoints import register_v2_endpoints

    from ge_sdk.serving.batcher import QueueFull, RequestTimeout, ShuttingDown

    app = FastAPI(title="GE models on Ray Serve", docs_url=None, redoc_url=None)
    dataplane = DataPlane(model_registry=repository)
    extension = ModelRepositoryExtension(model_registry=repository)
    app.add_api_route("/", dataplane.live)
    app.add_api_route("/metrics", metrics_handler, methods=["GET"])
    register_v1_endpoints(app, dataplane, extension)
    register_v2_endpoints(app, dataplane, extension)
    for exc, handler in ((errors.InvalidInput, errors.invalid_input_handler),
                         (errors.InferenceError, errors.inference_error_handler),
                         (errors.ModelNotFound, errors.model_not_found_handler),
                         (errors.ModelNotReady, errors.model_not_ready_handler),
                         (NotImplementedError, errors.not_implemented_error_handler),
                         (errors.UnsupportedProtocol, errors.unsupported_protocol_error_handler),
                         (errors.ServerNotLive, errors.server_not_live_handler),
                         (errors.ServerNotReady, errors.server_not_ready_handler)):
        app.add_exception_handler(exc, handler)

    async def refused(_: Request, e: Exception) -> JSONResponse:
        if isinstance(e, QueueFull):
            return JSONResponse({"error": str(e)}, 429, headers={"Retry-After": str(e.retry_after)})
        return JSONResponse({"error": str(e)}, 504 if isinstance(e, RequestTimeout) else 503)

    async def malformed(_: Request, e: Exception) -> JSONResponse:
        found: list[Any] = getattr(e, "errors", list)()
        what = "; ".join(f"{'/'.join(str(p) for p in x.get('loc', ()))}: {x.get('msg', '')}" for x in found[:5])
        return JSONResponse({"error": f"malformed request (not a v2 inference request in JSON): {what or e}"}, 400)

    async def bad_value(_: Request, e: Exception) -> JSONResponse:  # binary requests kserve cannot decode
        return JSONResponse({"error": f"bad request: {e}"}, 400)

    for exc in (QueueFull, RequestTimeout, ShuttingDown):
        app.add_exception_handler(exc, refused)
    app.add_exception_handler(RequestValidationError, malformed)
    app.add_exception_handler(KeyError, bad_value)
    app.add_exception_handler(ValueError, bad_value)
    app.add_exception_handler(Exception, errors.generic_exception_handler)
    app.add_middleware(InferContentType)
    return app


@serve.ingress()
class GeModels:
    """One replica: every model of ``models`` (``[(name, .om path)]``) loaded once and warmed up
    (``GeModel.load``), behind the kserve app (:func:`kserve_app`, built by Ray Serve after this
    constructor through ``__serve_build_asgi_app__``). ``model_options``: GeModel's keyword
    arguments (``threads``, ``max_batch``, ``max_delay_ms``, ``max_queue``, ``timeout_s``)."""

    def __init__(self, models: list[tuple[str, str]], model_options: dict[str, Any]) -> None:
        model_class = ge_model_class()  # first: kserve is imported with sys.argv hidden from its parser
        from kserve.model_repository import ModelRepository

        self.repository = ModelRepository()
        for name, path in models:
            model = model_class(path, name, **model_options)
            model.load()
            self.repository.update(model)

    def __serve_build_asgi_app__(self) -> Any:
        return kserve_app(self.repository)

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose models are not all ready is restarted."""
        bad = [name for name, m in self.repository.get_models().items() if not m.ready]
        if bad:
            raise RuntimeError(f"model(s) {bad} are not ready")


def _positive(name: str, value: Any, number: type = int) -> None:
    ok = isinstance(value, (int, float) if number is float else int) and not isinstance(value, bool)
    if not ok or value <= 0 or (number is float and not math.isfinite(value)):
        raise OptionError(f"serve_app({name}={value!r:.40}): {name} is a positive "
                          f"{'number' if number is float else 'integer'}")


def serve_app(model_paths: str | os.PathLike | Sequence[str | os.PathLike], *, names: Sequence[str] | None = None,
              threads: int = 1, min_replicas: int = 1, max_replicas: int = 1, target_ongoing_requests: float = 2.0,
              max_ongoing_requests: int | None = None, max_batch: int = 1, max_delay_ms: float = 0.0,
              max_queue: int = 64, timeout_s: float | None = None, local: bool = True,
              deployment_name: str = "GeModels") -> Any:
    """A Ray Serve application (for ``serve.run(app, route_prefix="/")``) serving the .om files
    ``model_paths`` (named ``names``, default the files' stems) over the Open Inference Protocol.

    Each replica is an actor of ``threads`` CPUs running each model with ``threads`` threads; the
    number of replicas autoscales between ``min_replicas`` and ``max_replicas`` to keep about
    ``target_ongoing_requests`` requests in flight per replica (``max_ongoing_requests`` at most;
    default enough for ``max_batch``). ``max_batch`` / ``max_delay_ms`` / ``max_queue`` /
    ``timeout_s``: each model's dynamic batcher, as ``ge serve``. ``local=False`` when the paths
    are those of the cluster's nodes, not of this machine.
    """
    models = model_table(model_paths, names, local=local)
    for name, value in (("threads", threads), ("min_replicas", min_replicas), ("max_replicas", max_replicas),
                        ("max_batch", max_batch), ("max_queue", max_queue)):
        _positive(name, value)
    _positive("target_ongoing_requests", target_ongoing_requests, float)
    if max_replicas < min_replicas:
        raise OptionError(f"serve_app: max_replicas ({max_replicas}) is below min_replicas ({min_replicas})",
                          hint="give min_replicas <= max_replicas")
    if max_ongoing_requests is None:
        max_ongoing_requests = max(5, 2 * max_batch, math.ceil(2 * target_ongoing_requests))
    _positive("max_ongoing_requests", max_ongoing_requests)
    scaling = {"min_replicas": min_replicas, "max_replicas": max_replicas,
               "target_ongoing_requests": target_ongoing_requests}
    options = {"threads": threads, "max_batch": max_batch, "max_delay_ms": max_delay_ms, "max_queue": max_queue,
               "timeout_s": timeout_s}
    deployment = serve.deployment(name=deployment_name, ray_actor_options={"num_cpus": threads},
                                  max_ongoing_requests=max_ongoing_requests, autoscaling_config=scaling)(GeModels)
    return deployment.bind(models, options)
