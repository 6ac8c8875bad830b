"""The ``ge serve`` command: compiled models over the Open Inference Protocol (registered by
:mod:`ge_tools.plugin`). kserve is imported only when the command runs."""

from __future__ import annotations

import argparse
import os

from ge_core.errors import ModelFileError, OptionError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", metavar="MODEL.om", help="compiled models to serve")
    p.add_argument("--name", action="append", default=[],
                   help="the endpoint name of each model, in order (default: the file's stem)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    p.add_argument("--grpc-port", type=int, default=None, help="also serve the v2 gRPC protocol on this port")
    p.add_argument("--threads", type=int, default=None, help="threads of one model run (default: the model's)")
    p.add_argument("--workers", type=int, default=1, help="runs of a model at once (default 1)")
    p.add_argument("--max-batch", type=int, default=1,
                   help="most rows the dynamic batcher joins along the model's batch dim (default 1: no batching)")
    p.add_argument("--max-delay-ms", type=float, default=0.0,
                   help="longest wait for more requests after a batch's first one (default 0)")
    p.add_argument("--max-queue", type=int, default=64, help="most requests waiting per model; more get 429 (default 64)")
    p.add_argument("--timeout", type=float, default=None, help="seconds a request may wait in the queue (504 after)")
    p.add_argument("--token", default=None,
                   help="require 'Authorization: Bearer TOKEN' (default: $GE_SERVE_TOKEN; health stays open)")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MiB (default 64; 413 above)")


def _check(args: argparse.Namespace) -> None:
    for m in args.models:
        if not os.path.isfile(m):
            raise ModelFileError(f"{m}: no such model file", hint="give the path of a compiled .om (ge compile)")
    if args.name and len(args.name) != len(args.models):
        raise OptionError(f"{len(args.name)} --name for {len(args.models)} models",
                          hint="give one --name per model, in the models' order, or none")
    for flag, v, low in (("--port", args.port, 0), ("--grpc-port", args.grpc_port, 1), ("--threads", args.threads, 1),
                         ("--workers", args.workers, 1), ("--max-batch", args.max_batch, 1),
                         ("--max-queue", args.max_queue, 1)):
        if v is not None and (v < low or (flag.endswith("port") and v > 65535)):
            raise OptionError(f"{flag} {v} is out of range", hint=f"give an integer of at least {low}")
    for flag, f in (("--max-delay-ms", args.max_delay_ms), ("--max-body-mb", args.max_body_mb)):
        if not f >= 0:
            raise OptionError(f"{flag} {f} must be at least 0")
    if args.timeout is not None and not args.timeout > 0:
        raise OptionError(f"--timeout {args.timeout} must be more than 0 seconds")


def run(args: argparse.Namespace) -> int:
    _check(args)
    from ge_sdk.serving.model import GeModel  # imports kserve: OptionError naming the extra without it

    from .server import serve

    names = args.name or [None] * len(args.models)
    if len(set(n or os.path.splitext(os.path.basename(m))[0] for n, m in zip(names, args.models))) != len(names):
        raise OptionError("two models would have the same name", hint="give each one a --name")
    models = [GeModel(m, n, threads=args.threads, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms,
                      max_queue=args.max_queue, timeout_s=args.timeout, workers=args.workers)
              for m, n in zip(args.models, names)]
    token = args.token or os.environ.get("GE_SERVE_TOKEN") or None
    return serve(models, host=args.host, port=args.port, grpc_port=args.grpc_port, token=token,
                 max_body_mb=args.max_body_mb)
