"""pytest configuration of every suite: the `gpu` marker, and skipping the
cases it marks where there is no CUDA device or the extension has no CUDA
kernels."""

import pytest
import torch


def _cuda_usable() -> bool:
    if not torch.cuda.is_available():
        return False
    from dynamicemb.table import extension

    return bool(extension().cuda_built())


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items) or _cuda_usable():
        return
    skip = pytest.mark.skip(reason="no CUDA device, or dynamicemb built without CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
