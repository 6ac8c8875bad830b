"""The ``ge serve`` command: compiled models over the Open Inference Protocol (registered by
:mod:`ge_tools.plugin`). kserve is imported only when the command runs."""

from __future__ import annotations

import argparse
import os

from ge_core.errors import ModelFileError, OptionError
from ge_sdk.serving.app import add_server_flags, check_server_flags


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="+", metavar="MODEL.om", help="compiled models to serve")
    p.add_argument("--name", action="append", default=[],
                   help="the endpoint name of each model, in order (default: the file's stem)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    add_server_flags(p)  # --port, the batcher, --token, --max-body-mb: as ge serve-ray
    p.add_argument("--grpc-port", type=int, default=None, help="also serve the v2 gRPC protocol on this port")
    p.add_argument("--threads", type=int, default=None, help="threads of one model run (default: the model's)")
    p.add_argument("--workers", type=int, default=1, help="runs of a model at once (default 1)")


def _check(args: argparse.Namespace) -> str | None:
    """Check the arguments; the bearer token to require."""
    for m in args.models:
        if not os.path.isfile(m):
            raise ModelFileError(f"{m}: no such model file", hint="give the path of a compiled .om (ge compile)")
    if args.name and len(args.name) != len(args.models):
        raise OptionError(f"{len(args.name)} --name for {len(args.models)} models",
                          hint="give one --name per model, in the models' order, or none")
    token = check_server_flags(args)
    for flag, v in (("--grpc-port", args.grpc_port), ("--threads", args.threads), ("--workers", args.workers)):
        if v is not None and (v < 1 or (flag == "--grpc-port" and v > 65535)):
            raise OptionError(f"{flag} {v} is out of range", hint="give an integer of at least 1")
    return token


def run(args: argparse.Namespace) -> int:
    token = _check(args)
    from ge_sdk.serving.model import GeModel  # imports kserve: OptionError naming the extra without it

    from .server import serve

    names = args.name or [None] * len(args.models)
    if len(set(n or os.path.splitext(os.path.basename(m))[0] for n, m in zip(names, args.models))) != len(names):
        raise OptionError("two models would have the same name", hint="give each one a --name")
    models = [GeModel(m, n, threads=args.threads, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms,
                      max_queue=args.max_queue, timeout_s=args.timeout, workers=args.workers)
              for m, n in zip(args.models, names)]
    return serve(models, host=args.host, port=args.port, grpc_port=args.grpc_port, token=token,
                 max_body_mb=args.max_body_mb)
