"""``GePredictor``: a compiled .om as a callable class for Ray Data's ``map_batches``.

    ds.map_batches(GePredictor, fn_constructor_kwargs={"model": "net.om"}, batch_size=64, concurrency=2)

Ray builds one instance per actor, so the .om is loaded once per actor (not per batch), with as
many threads as the actor was given CPUs. A batch is a dict of column name -> array; the columns
named like the model's inputs feed them (a one-input model takes the batch's only column whatever
its name: ``ray.data.from_numpy`` calls it ``data``), and the outputs come back as columns named
after the model's outputs, one row per input row.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import ge_core
from ge_core import InputError, OptionError


def actor_cpus() -> int:
    """The CPUs this process may use: the Ray actor's ``CPU`` resource when inside a Ray worker
    (an actor asked for ``num_cpus=2`` runs two threads), else the CPU affinity mask."""
    try:
        import ray

        if ray.is_initialized():
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
            if cpus:
                return max(1, int(cpus))
    except ImportError:
        pass
    except AssertionError:  # the driver, not a worker: Ray assigned it nothing
        pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def _names(value: Any, what: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise OptionError(f"GePredictor({what}={value!r:.60}): {what} is a list of column names",
                          hint=f"e.g. {what}=['id']")
    names = list(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise OptionError(f"GePredictor({what}=...): {bad[0]!r:.40} is not a column name", hint="give strings")
    return names


def _leading(model: Any, required: list[str]) -> int | str | None:
    """The first dim shared by the fed inputs of ``model`` (an int, a symbol), or None."""
    lead = {a.shape[0] if a.shape else None for a in model.inputs if a.name in required}
    return lead.pop() if len(lead) == 1 else None


def batch_sizes(model: Any, required: list[str]) -> tuple[list[int] | None, int, int | None]:
    """``(sizes, lo, hi)``: how many rows one run of ``model`` takes. ``sizes``: the only row
    counts it runs (a fixed batch dim ``b``: ``[b]``; a gear model's per-gear batches), else
    None and the compiled range ``lo..hi`` of a symbolic batch dim (``hi`` None: no bound; a
    model without a batch dim: ``(None, 1, None)``, the whole batch in one run)."""
    gears = getattr(model, "models", None)  # a gear model (atc --dynamic_batch_size ...): one model per gear
    if gears:
        dims = {_leading(g, required) for g in gears}
        if all(isinstance(d, int) for d in dims):
            return sorted(int(d) for d in dims if d is not None), 1, None
        return None, 1, None
    dim = _leading(model, required)
    if isinstance(dim, int):
        return [dim], 1, None
    if isinstance(dim, str):
        lo, hi = (getattr(model, "dim_ranges", {}) or {}).get(dim, (1, None))
        return None, max(1, lo), hi
    return None, 1, None


def run_plan(rows: int, sizes: list[int] | None, lo: int, hi: int | None) -> list[tuple[int, int]]:
    """``[(rows taken, rows run)]`` covering ``rows`` rows: runs of the largest allowed size that
    fits, the last one padded up to the smallest allowed size that holds it."""
    plan, left = [], rows
    while left > 0:
        if sizes is None:
            take = left if hi is None else min(hi, left)
            plan.append((take, max(take, lo)))
        else:
            fit = [s for s in sizes if s <= left]
            size = fit[-1] if fit else next(s for s in sizes if s >= left)
            take = min(size, left)
            plan.append((take, size))
        left -= take
    return plan


class GePredictor:
    """Runs a compiled .om over Ray Data batches (see the module docstring).

    ``model``: the .om path (each actor loads it once). ``threads``: the threads a run uses
    (default: the actor's CPUs, see :func:`actor_cpus`). ``passthrough``: input columns copied to
    the output unchanged (ids, labels); any other column that feeds no input is an error.
    ``verify_checksums`` as :func:`ge_core.load_om`.
    """

    def __init__(self, model: str | os.PathLike, *, threads: int | None = None, passthrough: Iterable[str] = (),
                 verify_checksums: bool = True) -> None:
        if isinstance(threads, bool) or not (threads is None or (isinstance(threads, int) and threads >= 1)):
            raise OptionError(f"GePredictor(threads={threads!r:.40}): threads is a positive integer",
                              hint="leave it out to use the actor's CPUs")
        self.path = os.fspath(model)
        self.threads = threads if threads is not None else actor_cpus()
        self.model = ge_core.load_om(self.path, threads=self.threads, verify_checksums=verify_checksums)
        self.passthrough = _names(passthrough, "passthrough")
        self.input_names = list(self.model.input_names)
        self.output_names = list(self.model.output_names)
        defaults = self.model.input_defaults
        self.required = [n for n in self.input_names if n not in defaults]
        clash = sorted(set(self.passthrough) & set(self.output_names))
        if clash:
            raise OptionError(f"{self.path}: passthrough column(s) {clash} have the names of model outputs",
                              hint="rename the columns before map_batches, or leave them out of passthrough")
        self.sizes, self.rows_lo, self.rows_hi = batch_sizes(self.model, self.required)

    def __repr__(self) -> str:
        return f"GePredictor({self.path!r}, threads={self.threads})"

    # ------------------------------------------------------------------------------------------
    def feeds(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The model's feeds from ``batch``'s columns (InputError naming any column that fits no input)."""
        cols = [c for c in batch if c not in self.passthrough]
        missing_pass = [c for c in self.passthrough if c not in batch]
        if missing_pass:
            raise InputError(f"{self.path}: passthrough column(s) {missing_pass} are not in the batch "
                             f"(its columns: {list(batch)})", hint="fix passthrough=[...] or the dataset")
        if len(self.required) == 1 and len(cols) == 1 and cols[0] not in self.input_names:
            return {self.required[0]: self.column(batch, cols[0], self.required[0])}
        extra = [c for c in cols if c not in self.input_names]
        missing = [n for n in self.required if n not in cols]
        if extra or missing:
            parts = [f"batch column(s) {extra} match no model input"] if extra else []
            parts += [f"the batch has no column for model input(s) {missing}"] if missing else []
            raise InputError(
                f"{self.path}: {'; '.join(parts)} (the model takes {self.input_names}, the batch has {list(batch)})",
                hint="name the columns after the model's inputs, drop the others before map_batches, or list "
                     "them in passthrough=[...] to copy them to the output")
        return {c: self.column(batch, c, c) for c in cols}

    def column(self, batch: Mapping[str, Any], name: str, input_name: str) -> np.ndarray:
        """Column ``name`` as one array; Ray gives a column of differently shaped (or
        variable-shape tensor) rows as an object array of per-row arrays: they are stacked."""
        a = batch[name]
        if isinstance(a, np.ndarray) and a.dtype != object:
            return a
        try:
            rows = [np.asarray(r) for r in a]
            arr = np.stack(rows) if rows else np.asarray(a)
        except (TypeError, ValueError) as e:
            shapes = sorted({str(np.shape(r)) for r in a})[:3]
            raise InputError(f"{self.path}: column '{name}' (input '{input_name}') cannot be stacked into one "
                             f"array: {e} (row shapes {', '.join(shapes)})",
                             hint="give every row the same shape (resize or pad in an earlier map step)") from None
        if arr.dtype == object:
            raise InputError(f"{self.path}: column '{name}' (input '{input_name}') holds Python objects, not numbers",
                             hint="convert it to a numeric array in an earlier map step")
        return arr

    def run(self, feeds: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """The model's outputs on ``rows`` rows, in runs of the sizes the model takes (see
        :func:`run_plan`; padding repeats the last row and its outputs are dropped)."""
        if rows == 0:  # Ray may hand an actor an empty block
            empty = {a.name: np.zeros((0, *[int(d) for d in a.shape[1:]]), a.dtype) for a in self.model.outputs
                     if a.shape and a.dtype is not None and all(isinstance(d, int) for d in a.shape[1:])}
            if len(empty) == len(self.output_names):
                return empty
        plan = run_plan(rows, self.sizes, self.rows_lo, self.rows_hi)
        if len(plan) <= 1 and all(take == size for take, size in plan):
            return self.model.run(feeds)
        parts: list[dict[str, np.ndarray]] = []
        start = 0
        for take, size in plan:
            chunk = {k: v[start:start + take] for k, v in feeds.items()}
            if size > take:
                chunk = {k: np.concatenate([v, np.repeat(v[-1:], size - take, axis=0)]) for k, v in chunk.items()}
            parts.append({k: v[:take] for k, v in self.model.run(chunk).items()})
            start += take
        return {k: np.concatenate([p[k] for p in parts]) for k in self.output_names}

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(batch, Mapping):
            if hasattr(batch, "columns") and hasattr(batch, "__getitem__"):  # a pandas DataFrame
                batch = {c: batch[c].to_numpy() for c in batch.columns}
            else:
                raise InputError(f"{self.path}: GePredictor takes a batch as a dict of column -> array, not a "
                                 f"{type(batch).__name__}", hint="use map_batches(..., batch_format='numpy')")
        feeds = self.feeds(batch)
        lens = {k: (v.shape[0] if v.ndim else None) for k, v in feeds.items()}
        rows = next(iter(lens.values()), 0)
        if len(set(lens.values())) != 1 or rows is None:
            raise InputError(f"{self.path}: the feeds have different numbers of rows {lens}",
                             hint="each column holds one item per row")
        try:
            out = self.run(feeds, rows)
        except InputError as e:
            cols = [c for c in batch if c not in self.passthrough]
            where = f" (the batch's column '{cols[0]}' feeds it)" if len(cols) == 1 and cols[0] not in feeds else ""
            raise InputError(f"{self.path}: {e.detail}{where}", hint=e.hint) from None
        result: dict[str, np.ndarray] = {}
        for name in self.output_names:
            y = np.asarray(out[name])
            if y.ndim == 0 or y.shape[0] != rows:
                raise InputError(f"{self.path}: output '{name}' has shape {list(y.shape)}, not one row per batch row "
                                 f"({rows})", hint="GePredictor needs a model whose outputs have the batch as dim 0")
            result[name] = y
        for c in self.passthrough:
            result[c] = np.asarray(batch[c])
        return result
