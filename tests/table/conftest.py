"""pytest configuration of the table tests: the `gpu` marker, and skipping
CUDA cases where there is no CUDA device or the extension has no CUDA kernels."""

import os
import sys

import pytest
import torch

# The tests import their helpers (table_model, table_testlib) by module name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _cuda_usable() -> bool:
    if not torch.cuda.is_available():
        return False
    from dynamicemb.table._native import extension

    return bool(extension().cuda_built())


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")


def pytest_collection_modifyitems(config, items):
    if _cuda_usable():
        return
    skip = pytest.mark.skip(reason="no CUDA device, or dynamicemb built without CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
