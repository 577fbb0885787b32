"""The `gpu` marker: CUDA cases, skipped unless a CUDA device is visible and
dynamicemb is built with CUDA kernels.

A conftest.py imports these hooks (tests/storage's, with the `multigpu` ones
of multigpu_marker.py)."""

import pytest
import torch


def cuda_usable() -> bool:
    """A CUDA device and dynamicemb's CUDA kernels."""
    if not torch.cuda.is_available():
        return False
    from dynamicemb.table._native import extension

    return bool(extension().cuda_built())


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")


def pytest_collection_modifyitems(config, items):
    if cuda_usable():
        return
    skip = pytest.mark.skip(reason="no CUDA device, or dynamicemb built without CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
