"""Prometheus metrics of a served model, in ``prometheus_client``'s default registry (the one
KServe's model server exposes at ``/metrics``).

The collectors are created once per process and labelled by model (requests and latency also by
status), so several models and several :class:`Metrics` of one model share them. Without
``prometheus_client`` installed every method does nothing: the batcher runs the same.
"""

from __future__ import annotations

import threading
from typing import Any

#: statuses a request ends with (the ``status`` label); see :func:`status_of`
OK, BAD_REQUEST, QUEUE_FULL, TIMEOUT, SHUTTING_DOWN, ERROR = (
    "ok", "bad_request", "queue_full", "timeout", "shutting_down", "error")
#: batch-size buckets (rows): powers of two up to 256
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: latency buckets (seconds): 1 ms to 60 s
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_lock = threading.Lock()
_collectors: dict[str, Any] | None = None


def _create() -> dict[str, Any] | None:
    """The process's collectors, created on first use; None without prometheus_client."""
    global _collectors
    with _lock:
        if _collectors is None:
            try:
                import prometheus_client as prom
            except ImportError:
                _collectors = {}
            else:
                _collectors = {
                    "requests": prom.Counter("ge_requests_total", "Inference requests answered, by model and status",
                                             ["model", "status"]),
                    "latency": prom.Histogram("ge_request_latency_seconds",
                                              "Time from a request's arrival to its answer (queue and run)",
                                              ["model", "status"], buckets=LATENCY_BUCKETS),
                    "depth": prom.Gauge("ge_queue_depth", "Requests waiting in the batcher's queue", ["model"]),
                    "batch": prom.Histogram("ge_batch_size", "Rows per model run (requests batched together)",
                                            ["model"], buckets=BATCH_BUCKETS),
                    "inference": prom.Histogram("ge_inference_seconds", "Time of one model run (one batch)",
                                                ["model"], buckets=LATENCY_BUCKETS),
                }
        return _collectors or None


def status_of(exc: BaseException | None) -> str:
    """The ``status`` label of a request that ended with ``exc`` (None: answered)."""
    if exc is None:
        return OK
    from ge_core.errors import InputError

    from .batcher import QueueFull, RequestTimeout, ShuttingDown

    for kind, status in ((QueueFull, QUEUE_FULL), (RequestTimeout, TIMEOUT), (ShuttingDown, SHUTTING_DOWN),
                         (InputError, BAD_REQUEST)):
        if isinstance(exc, kind):
            return status
    return ERROR


class Metrics:
    """The metrics of one model (``model_name``: the ``model`` label)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._c = _create()

    @property
    def enabled(self) -> bool:
        """Whether prometheus_client is installed (otherwise every method is a no-op)."""
        return self._c is not None

    def request(self, status: str, seconds: float) -> None:
        """One request answered (or refused) with ``status`` after ``seconds``."""
        if self._c is not None:
            self._c["requests"].labels(self.model_name, status).inc()
            self._c["latency"].labels(self.model_name, status).observe(seconds)

    def queue_depth(self, depth: int) -> None:
        """The queue now holds ``depth`` requests."""
        if self._c is not None:
            self._c["depth"].labels(self.model_name).set(depth)

    def batch(self, rows: int, seconds: float) -> None:
        """One model run over ``rows`` rows took ``seconds``."""
        if self._c is not None:
            self._c["batch"].labels(self.model_name).observe(rows)
            self._c["inference"].labels(self.model_name).observe(seconds)
