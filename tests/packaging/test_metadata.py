"""The package's metadata says what a package index shows: classifiers
(license, Python versions within requires-python, typed), and the PEP 561
marker is shipped (tools/check_dist.py checks both in the built metadata and
the wheel)."""

import re

import tomllib

from tests.packaging.repo_files import repo_root


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
