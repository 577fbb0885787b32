"""The `multigpu` marker of the distributed tests: their NCCL variants, one
process per GPU, skipped unless at least two CUDA devices are visible and
dynamicemb is built with CUDA kernels.

The conftest.py of tests/shard and of tests/twin import these hooks."""

import pytest
import torch


def gpu_count() -> int:
    """Visible CUDA devices, 0 when dynamicemb has no CUDA kernels."""
    if not torch.cuda.is_available():
        return 0
    from dynamicemb.table import extension

    return torch.cuda.device_count() if extension().cuda_built() else 0


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "multigpu: NCCL over every visible GPU (skipped with fewer than two CUDA devices)",
    )


def pytest_collection_modifyitems(config, items):
    if gpu_count() >= 2:
        return
    skip = pytest.mark.skip(reason="fewer than two CUDA devices, or dynamicemb built without CUDA")
    for item in items:
        if "multigpu" in item.keywords:
            item.add_marker(skip)
