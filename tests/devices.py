"""The devices the op tests run on: the CPU always, and CUDA as a case marked
`gpu`, which tests/conftest.py skips where no CUDA device (or no CUDA build of
dynamicemb) is there."""

import pytest

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")]
