"""pytest configuration of the table tests: the `gpu` marker
(tests/shard/gpu_marker.py: CUDA cases skip where there is no CUDA device or
the extension has no CUDA kernels)."""

import os
import sys

# The tests import their helpers (table_model, table_testlib) by module name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))

from gpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
