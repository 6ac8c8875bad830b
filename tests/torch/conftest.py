"""Fixtures of the PyTorch tests: models, their eager results and exported programs, per session.

The whole folder is skipped when PyTorch (the ``torch`` extra) is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest


def _has_torch() -> bool:
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.origin is not None  # not this folder as a namespace package


if not _has_torch():
    collect_ignore_glob = ["test_*.py"]
else:
    import torch

    torch.set_num_threads(1)  # 2 cores, 2 xdist workers

    @pytest.fixture(scope="session")
    def zoo():
        """``zoo(name) -> (model, example inputs, eager outputs)``, built once per session."""
        from torch_zoo import make

        cache: dict = {}

        def get(name: str):
            if name not in cache:
                model, args = make(name)
                with torch.no_grad():
                    ref = model(*args)
                cache[name] = (model, args, ref)
            return cache[name]

        return get
