"""The markers of the storage tests: `gpu` (CUDA cases skip without a
device) and `multigpu` (tests/shard/multigpu_marker.py), and the harnesses of
tests/shard on the import path."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))

import multigpu_marker


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
