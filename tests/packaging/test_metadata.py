"""The package's metadata says what a package index shows: classifiers
(license, Python versions within requires-python, typed), and the PEP 561
marker is shipped (tools/check_dist.py checks both in the built metadata and
the wheel); `pip check` in an environment set up as docs/building.md says
reports nothing but torchrec's requirement of the CUDA FBGEMM on a CPU machine
(tools/check_dist.py --fresh-venv checks the fresh venv so)."""

import re
import subprocess
import sys

import tomllib

from tests.packaging.repo_files import repo_root, tool


def _project():
    return tomllib.loads((repo_root() / "pyproject.toml").read_text())


def test_classifiers_follow_requires_python_and_say_typed():
    project = _project()["project"]
    classifiers = project["classifiers"]
    low = re.fullmatch(r">=3\.(\d+)", project["requires-python"]).group(1)
    versions = [int(m.group(1)) for c in classifiers if (m := re.search(r":: 3\.(\d+)$", c))]
    assert versions and min(versions) == int(low), versions
    assert "Typing :: Typed" in classifiers
    # The license is the SPDX expression (PEP 639), not a classifier as well.
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_the_pep_561_marker_is_package_data():
    assert (repo_root() / "dynamicemb" / "py.typed").is_file()
    assert "py.typed" in _project()["tool"]["setuptools"]["package-data"]["dynamicemb"]


def test_pip_check_of_this_environment_reports_no_problem():
    import torch

    check_dist = tool("check_dist")
    ran = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert check_dist.pip_check_problems(ran.stdout + ran.stderr, bool(torch.version.cuda)) == []


def test_pip_check_problems_leave_out_only_torchrecs_cuda_fbgemm_on_the_cpu():
    check_dist = tool("check_dist")
    torchrec = "torchrec 1.8.0 requires fbgemm-gpu, which is not installed."
    other = "torchrec 1.8.0 has requirement tensordict>=0.10, but you have tensordict 0.9."
    assert check_dist.pip_check_problems(f"{torchrec}\n", cuda=False) == []
    assert check_dist.pip_check_problems(f"{torchrec}\n{other}\n", cuda=False) == [other]
    assert check_dist.pip_check_problems(f"{torchrec}\n", cuda=True) == [torchrec]
    assert check_dist.pip_check_problems("No broken requirements found.\n", cuda=True) == []
