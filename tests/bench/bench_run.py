"""Runs a benchmark of tools/bench/ in a new process, as its docs say to, with
this process's sys.path on PYTHONPATH (the checkout's dynamicemb); or several,
one after another in one new process (``run_each``), so that torch, TorchRec
and dynamicemb are imported once for all of them."""

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _above_root(path: str) -> bool:
    """Whether ``path`` is a folder above the checkout (pytest's rootdir
    insertion can put one on sys.path; its subfolders would shadow modules of
    the standard library in a new process)."""
    path = os.path.abspath(path or ".")
    return path != ROOT and ROOT.startswith(path.rstrip(os.sep) + os.sep)


def _env() -> dict[str, str]:
    path = [ROOT, *(p for p in sys.path if not _above_root(p))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def _script(script: str) -> str:
    return os.path.join(ROOT, "tools", "bench", script)


def _stdout_of(returncode: int, stdout: str, stderr: str) -> str:
    """``stdout``; fails the test (with the end of both outputs) when the
    benchmark did not exit 0."""
    assert returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def run(script: str, *args: str, timeout: float = 600) -> str:
    """The standard output of ``tools/bench/<script> args``; fails the test
    (with the end of both outputs) when the benchmark does not exit 0."""
    proc = subprocess.run(
        [sys.executable, _script(script), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return _stdout_of(proc.returncode, proc.stdout, proc.stderr)


class Outputs:
    """What ``run_each`` ran: ``outputs[name]`` is the standard output of
    that benchmark, failing the test that asks (with the end of both
    outputs) when it did not exit 0."""

    def __init__(self, results: dict[str, list]) -> None:
        self._results = results

    def __getitem__(self, name: str) -> str:
        return _stdout_of(*self._results[name])


def run_each(calls: dict[str, tuple[str, ...]], timeout: float = 600) -> Outputs:
    """Runs the benchmarks ``calls`` names (name -> (script, *args)) one
    after another in one new process, each as ``python tools/bench/<script>
    args`` would run it: as ``__main__`` with its folder first on sys.path,
    its own argv, exit status and standard output and error."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "calls.json")
        with open(plan, "w") as f:
            json.dump({k: [_script(v[0]), *v[1:]] for k, v in calls.items()}, f)
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), plan, tmp],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with open(os.path.join(tmp, "results.json")) as f:
            return Outputs(json.load(f))


def table_rows(out: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown rows of ``out`` whose first cell is ``first_cell``."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    return rows


def _run_here(argv: list[str]) -> list:
    """Runs ``argv[0]`` as ``__main__`` in this process with ``argv``;
    returns [its exit status, what it printed to sys.stdout, to sys.stderr]."""
    saved = sys.argv, sys.path[:]
    out, err = io.StringIO(), io.StringIO()
    sys.argv, sys.path[:0] = list(argv), [os.path.dirname(argv[0])]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(argv[0], run_name="__main__")
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            rc = 1
        finally:
            sys.argv, sys.path[:] = saved
    return [rc, out.getvalue(), err.getvalue()]


def _main(plan: str, tmp: str) -> None:
    """``run_each``'s process: every call of ``plan`` in turn, the results
    (name -> [exit status, stdout, stderr]) into ``tmp``/results.json."""
    with open(plan) as f:
        calls = json.load(f)
    results = {name: _run_here(argv) for name, argv in calls.items()}
    with open(os.path.join(tmp, "results.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    _main(*sys.argv[1:])
