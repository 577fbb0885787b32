"""The `gpu` marker of the embedding tests (tests/shard/gpu_marker.py): CUDA
cases skip without a device."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))

from gpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
