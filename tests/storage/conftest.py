"""The `multigpu` marker of the storage tests (tests/shard/multigpu_marker.py;
`gpu` is tests/conftest.py's), and the harnesses of tests/shard on the import
path."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))

from multigpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
