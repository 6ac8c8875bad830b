"""A Ray Serve deployment of compiled .om models speaking the Open Inference Protocol (KServe v2),
the protocol of ``ge serve``.

kserve 0.21's ModelServer no longer hosts Ray Serve handles, so the deployment is the other way
round: each replica holds a ``kserve.ModelRepository`` of :class:`ge_sdk.serving.model.GeModel`
(the model adapter of ``ge serve``: validation, the dynamic batcher, metadata) and its ingress is
the app of ``ge serve`` (:func:`ge_sdk.serving.app.kserve_app`: kserve's REST endpoints with the
bearer token, body limit, request ids and JSON log lines, the same error statuses), built inside
the replica once the models are loaded and warmed up. Ray Serve's HTTP proxy routes to the
replicas and scales their number on queue length (``target_ongoing_requests`` per replica,
between ``min_replicas`` and ``max_replicas``).

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


@serve.ingress()
class GeModels:
    """One replica: every model of ``models`` (``[(name, .om path)]``) loaded once and warmed up
    (``GeModel.load``), behind the app of ``ge serve`` (``kserve_app``, built by Ray Serve after
    this constructor through ``__serve_build_asgi_app__``). ``model_options``: GeModel's keyword
    arguments (``threads``, ``max_batch``, ``max_delay_ms``, ``max_queue``, ``timeout_s``);
    ``app_options``: kserve_app's (``token``, ``max_body``)."""

    def __init__(self, models: list[tuple[str, str]], model_options: dict[str, Any],
                 app_options: dict[str, Any] | None = None) -> None:
        from ge_sdk.serving.app import json_logging, model_repository
        from ge_sdk.serving.model import GeModel

        json_logging()  # the request lines in the replica's log, as ge serve writes them
        self.app_options = dict(app_options or {})
        loaded = [GeModel(path, name, **model_options) for name, path in models]
        for model in loaded:
            model.load()
        self.repository = model_repository(loaded)

    def __serve_build_asgi_app__(self) -> Any:
        from ge_sdk.serving.app import kserve_app

        return kserve_app(self.repository, **self.app_options)

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
              max_queue: int = 64, timeout_s: float | None = None, token: str | None = None,
              max_body_mb: float = 64.0, local: bool = True, deployment_name: str = "GeModels") -> Any:
    """A Ray Serve application (for ``serve.run(app, route_prefix="/")``) serving the .om files
    ``model_paths`` (named ``names``, default the files' stems) over the Open Inference Protocol.

    Each replica is an actor of ``threads`` CPUs running each model with ``threads`` threads; the
    number of replicas autoscales between ``min_replicas`` and ``max_replicas`` to keep about
    ``target_ongoing_requests`` requests in flight per replica (``max_ongoing_requests`` at most;
    default enough for ``max_batch``). ``max_batch`` / ``max_delay_ms`` / ``max_queue`` /
    ``timeout_s``: each model's dynamic batcher, as ``ge serve``. ``token``: the bearer token every
    request but the health checks must carry (401 without; None: none); ``max_body_mb``: the
    largest request body (413 above). ``local=False`` when the paths are those of the cluster's
    nodes, not of this machine.
    """
    models = model_table(model_paths, names, local=local)
    for name, value in (("threads", threads), ("min_replicas", min_replicas), ("max_replicas", max_replicas),
                        ("max_batch", max_batch), ("max_queue", max_queue)):
        _positive(name, value)
    _positive("target_ongoing_requests", target_ongoing_requests, float)
    _positive("max_body_mb", max_body_mb, float)
    if token is not None and not (isinstance(token, str) and token):
        raise OptionError("serve_app(token=...): the bearer token is a non-empty string", hint="or None for no token")
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
    return deployment.bind(models, options, {"token": token, "max_body": int(max_body_mb * 2**20)})
