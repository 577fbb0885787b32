"""The checkout's dynamicemb for the examples run from it where dynamicemb is not
installed (`python examples/train_dlrm.py`, as README.md writes it): the checkout,
the folder above this one, is appended to sys.path, and so reaches the processes
the examples start (they hand sys.path on: train_dlrm.job_env, torch's spawn).
An installed dynamicemb is left alone. Imported for this effect alone."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if importlib.util.find_spec("dynamicemb") is None and os.path.isfile(
    os.path.join(ROOT, "dynamicemb", "__init__.py")
):
    sys.path.append(ROOT)
