"""The `multigpu` marker (tests/shard/multigpu_marker.py)."""

from tests.shard.multigpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
