"""The `multigpu` marker of the admission tests (tests/shard/multigpu_marker.py;
`gpu` is tests/conftest.py's)."""

from tests.shard.multigpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
