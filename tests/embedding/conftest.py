"""The `gpu` marker of the embedding tests; CUDA cases skip without a device."""

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        from dynamicemb.table._native import extension

        if extension().cuda_built():
            return
    skip = pytest.mark.skip(reason="no CUDA device, or dynamicemb built without CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
