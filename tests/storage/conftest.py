"""The markers of the storage tests, `gpu` and `multigpu` (tests/shard's
gpu_marker.py and multigpu_marker.py), and the harnesses of tests/shard on
the import path."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shard"))

import gpu_marker
import multigpu_marker


def pytest_configure(config):
    gpu_marker.pytest_configure(config)
    multigpu_marker.pytest_configure(config)


def pytest_collection_modifyitems(config, items):
    gpu_marker.pytest_collection_modifyitems(config, items)
    multigpu_marker.pytest_collection_modifyitems(config, items)
