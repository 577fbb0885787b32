"""pytest configuration of the table tests (the `gpu` marker is tests/conftest.py's)."""

import os
import sys

# The tests import their helpers (table_model, table_testlib) by module name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
