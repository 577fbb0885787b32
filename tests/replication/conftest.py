"""The `multigpu` marker of the replication tests (tests/shard/multigpu_marker.py;
`gpu` is tests/conftest.py's), and the harnesses of tests/shard and
tests/checkpoint on the import path."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for sub in ("shard", "checkpoint"):
    sys.path.insert(0, os.path.join(HERE, "..", sub))

from multigpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: E402, F401
