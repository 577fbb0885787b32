"""The `multigpu` marker (tests/shard/multigpu_marker.py) and the harnesses of
tests/shard on the import path."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))

from multigpu_marker import pytest_collection_modifyitems, pytest_configure  # noqa: F401
