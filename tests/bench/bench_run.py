"""Runs a benchmark of tools/bench/ in a new process, as its docs say to, with
this process's sys.path on PYTHONPATH (the checkout's dynamicemb)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _above_root(path: str) -> bool:
    """Whether ``path`` is a folder above the checkout (pytest's rootdir
    insertion can put one on sys.path; its subfolders would shadow modules of
    the standard library in a new process)."""
    path = os.path.abspath(path or ".")
    return path != ROOT and ROOT.startswith(path.rstrip(os.sep) + os.sep)


def run(script: str, *args: str, timeout: float = 600) -> str:
    """The standard output of ``tools/bench/<script> args``; fails the test
    (with the end of both outputs) when the benchmark does not exit 0."""
    path = [ROOT, *(p for p in sys.path if not _above_root(p))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "bench", script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def table_rows(out: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown rows of ``out`` whose first cell is ``first_cell``."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    return rows
