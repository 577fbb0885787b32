"""tools/main.sh: -h / --help answers at once with the job's options, without
installing or building; any other call installs first."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.packaging.repo_files import repo_root

SETUP_MARK = "setup_env ran"
HELP_MARK = "usage: the job help"


@pytest.fixture
def checkout(tmp_path):
    """A checkout of main.sh whose setup step and job only say that they ran."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "examples").mkdir()
    shutil.copy(repo_root() / "tools" / "main.sh", tmp_path / "tools" / "main.sh")
    (tmp_path / "tools" / "setup_env.sh").write_text(f"echo '{SETUP_MARK}'; exit 3\n")
    (tmp_path / "examples" / "train_dlrm.py").write_text(
        f"import sys\nprint('{HELP_MARK}' if '--help' in sys.argv else 'trained')\n"
    )
    return tmp_path


def _main_sh(checkout, *args):
    return subprocess.run(
        ["bash", str(checkout / "tools" / "main.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=""),
    )


def _with_venv(checkout):
    """A .venv/bin/python that is this interpreter (which has torch)."""
    python = checkout / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_jobs_options_without_setting_up(checkout, flag):
    _with_venv(checkout)
    start = time.monotonic()
    ran = _main_sh(checkout, "--steps", "3", flag)
    assert time.monotonic() - start < 30
    assert ran.returncode == 0, ran.stderr
    assert HELP_MARK in ran.stdout and SETUP_MARK not in ran.stdout + ran.stderr


def test_help_before_the_venv_exists_says_how_to_get_it(checkout):
    ran = _main_sh(checkout, "--help")
    assert ran.returncode == 0, ran.stderr
    assert "usage: bash tools/main.sh" in ran.stdout and SETUP_MARK not in ran.stdout


def test_without_help_it_sets_up_first(checkout):
    _with_venv(checkout)
    ran = _main_sh(checkout, "--steps", "3")
    assert ran.returncode == 3 and SETUP_MARK in ran.stdout
