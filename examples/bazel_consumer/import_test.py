"""Imports the module given on the command line: a public Python target of
dynamicemb, alone among the test's dependencies, makes the module that
docs/building.md ("Targets") names for it importable."""

import importlib
import sys

module = importlib.import_module(sys.argv[1])
print(f"import_test: {sys.argv[1]} from {module.__file__}")
