"""The `multigpu` marker (multigpu_marker.py, shared with tests/twin)."""

from tests.shard.multigpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
