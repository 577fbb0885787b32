"""pytest configuration of the admission tests: the helpers' directories on
the path, the `gpu` marker (CUDA cases skip without a device or without the
extension's CUDA kernels) and the `multigpu` marker of tests/shard."""

import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(_HERE, "..", "shard"))

import multigpu_marker  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")
    multigpu_marker.pytest_configure(config)


def pytest_collection_modifyitems(config, items):
    multigpu_marker.pytest_collection_modifyitems(config, items)
    if torch.cuda.is_available():
        from dynamicemb.table._native import extension

        if extension().cuda_built():
            return
    skip = pytest.mark.skip(reason="no CUDA device, or dynamicemb built without CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
