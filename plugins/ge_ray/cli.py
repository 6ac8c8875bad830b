"""The ``ge serve-ray`` command (registered by :mod:`ge_ray.plugin`): compiled models over the Open
Inference Protocol on Ray Serve. Ray is imported only when the command runs."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from ge_core.errors import ExecutionError, OptionError
from ge_sdk.serving.app import add_server_flags, check_server_flags

#: The Serve application's name on the cluster (``serve status`` lists it).
APP_NAME = "ge"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", metavar="MODEL.om", help="compiled models to serve")
    p.add_argument("--name", action="append", default=[],
                   help="the endpoint name of each model, in order (default: the file's stem)")
    p.add_argument("--address", default=None,
                   help="the Ray cluster: 'auto' (one started with 'ray start' on this node) or ray://HOST:10001 "
                        "(default: $RAY_ADDRESS, else a local Ray started for this command)")
    p.add_argument("--replicas", default="1", metavar="MIN:MAX",
                   help="replicas of the deployment, autoscaled on queue length between MIN and MAX (default 1)")
    p.add_argument("--target-ongoing-requests", type=float, default=2.0,
                   help="requests in flight per replica the autoscaler aims at (default 2)")
    p.add_argument("--threads", type=int, default=1, help="CPUs of a replica and threads of one run (default 1)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address Ray Serve's HTTP proxy binds (default 127.0.0.1; 0.0.0.0 for every interface)")
    add_server_flags(p, per="model and replica")  # --port, the batcher, --token, --max-body-mb: as ge serve
    p.add_argument("--detach", action="store_true",
                   help="deploy and return, leaving the application on the cluster (stop it with 'serve shutdown')")


def replicas(text: str) -> tuple[int, int]:
    """``(min, max)`` from ``N`` or ``MIN:MAX``."""
    lo, _, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise OptionError(f"--replicas {text!r}: give N or MIN:MAX", hint="e.g. --replicas 1:4") from None
    if a < 1 or b < a:
        raise OptionError(f"--replicas {text!r}: need 1 <= MIN <= MAX", hint="e.g. --replicas 1:4")
    return a, b


def _ray() -> Any:
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise OptionError(f"ge serve-ray needs Ray Serve, which is not installed ({e})",
                          hint="pip install 'ge-python[ray]'") from None
    return ray, serve


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def _deploy(serve: Any, app: Any) -> None:
    """``serve.run`` of ``app``; a replica that fails to start (a bad .om) is an ExecutionError
    with the replica's own error (the last line of Ray's deployment status), not a traceback."""
    try:
        serve.run(app, name=APP_NAME, route_prefix="/")
    except Exception as e:  # Ray says only that the deployment failed; its status says why
        why = [str(e)]
        try:
            status = serve.status().applications.get(APP_NAME)
            for d in (status.deployments.values() if status else ()):
                lines = [ln for ln in (d.message or "").strip().splitlines() if ln.strip()]
                why += lines[-1:]
        except Exception:  # the status is a best effort: the failure is reported either way
            pass
        raise ExecutionError("Ray Serve could not deploy the models: " + " / ".join(why),
                             hint="fix the model named above, or see the replica's log under /tmp/ray") from None


def run(args: argparse.Namespace) -> int:
    lo, hi = replicas(args.replicas)
    token = check_server_flags(args)
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    if args.detach and address is None:
        raise OptionError("--detach leaves the application on a Ray cluster: give --address",
                          hint="start one with 'ray start --head', then --address auto")
    ray, serve = _ray()
    from .serve import model_table, serve_app

    names = [n for n, _ in model_table(args.models, args.name or None, local=address is None)]  # before Ray starts
    app = serve_app(args.models, names=names, threads=args.threads, min_replicas=lo, max_replicas=hi,
                    target_ongoing_requests=args.target_ongoing_requests, max_batch=args.max_batch,
                    max_delay_ms=args.max_delay_ms, max_queue=args.max_queue, timeout_s=args.timeout,
                    token=token, max_body_mb=args.max_body_mb, local=address is None)
    if address is None:
        ray.init(include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        _deploy(serve, app)
        print(f"serving {', '.join(names)} at http://{args.host}:{args.port}/v2 on Ray Serve "
              f"({lo}..{hi} replicas of {args.threads} CPU{', bearer token required' if token else ''})", flush=True)
        if args.detach:
            return 0
        _wait_for_signal()
        serve.delete(APP_NAME)
        if address is None:
            serve.shutdown()
        return 0
    finally:
        ray.shutdown()
