"""pytest configuration of the fuzz suite: the `gpu` marker; the helpers of
tests/table (the table model) are imported by module name."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "table"))


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
