"""The `multigpu` and `gpu` markers and the harnesses of tests/shard and
tests/checkpoint on the import path."""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("shard", "checkpoint"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from multigpu_marker import pytest_collection_modifyitems as _multigpu_skips  # noqa: E402
from multigpu_marker import pytest_configure as _multigpu_configure  # noqa: E402


def pytest_configure(config):
    _multigpu_configure(config)
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")


def pytest_collection_modifyitems(config, items):
    _multigpu_skips(config, items)
    if torch.cuda.is_available():
        from dynamicemb.table._native import extension

        if extension().cuda_built():
            return
    skip = pytest.mark.skip(reason="no CUDA device, or dynamicemb built without CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
