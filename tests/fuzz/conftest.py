"""pytest configuration of the fuzz suite: the helpers of tests/table (the
table model) are imported by module name. (The `gpu` marker is registered in
pyproject.toml; the CUDA test skips itself without a device.)"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "table"))
