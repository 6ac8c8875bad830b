"""ge_ray (extra ``ray``): compiled models on Ray.

* :class:`GePredictor`: a callable class for Ray Data's ``map_batches`` (batch inference over a
  dataset, one loaded .om per actor);
* :func:`serve_app`: a Ray Serve application speaking the Open Inference Protocol (KServe v2), as
  ``ge serve`` does, with replicas autoscaled on queue length (``ge serve-ray`` runs it).

Both are imported on first use, so ``import ge_ray`` (and ``ge --help``) imports no Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .predictor import GePredictor
    from .serve import serve_app

__all__ = ["GePredictor", "serve_app"]

_LAZY = {"GePredictor": "predictor", "serve_app": "serve"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ge_ray' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"ge_ray.{module}"), name)
    globals()[name] = value
    return value
