"""The fuzz suite (fuzz_cases.py) in a child process, so that a crash of the
process (a segfault, an abort) fails this test with the case that caused it
instead of ending the session.

DEMB_FUZZ_SCALE scales every target's number of cases (default 1: at least
10,000 cases in all); DEMB_FUZZ_SEED replaces the fixed cases by random ones.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_CASES = 10_000


# On CUDA the raw ops do not check values (that would synchronize: bad keys get
# status INVALID instead); the public classes check them, as on the CPU.
CUDA_TARGETS = ["ScoredHashTable()", "ScoredHashTable methods", "BatchedDynamicEmbeddingTablesV2"]


def _run(tmp_path, device, targets=()):
    progress = tmp_path / "progress.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env["DEMB_FUZZ_DEVICE"] = device
    cmd = [
        sys.executable,
        os.path.join(HERE, "fuzz_cases.py"),
        "--examples",
        os.environ.get("DEMB_FUZZ_SCALE", "1"),
        "--progress",
        str(progress),
    ]
    if os.environ.get("DEMB_FUZZ_SEED"):
        cmd += ["--seed", os.environ["DEMB_FUZZ_SEED"]]
    cmd += list(targets)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    last = progress.read_text() if progress.exists() else "(no case started)"
    if out.returncode < 0:
        pytest.fail(
            f"the fuzz process died by signal {signal.Signals(-out.returncode).name} in case\n"
            f"  {last}\n{out.stderr[-3000:]}"
        )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, (
        f"no summary (return code {out.returncode}); last case: {last}\n{out.stderr[-3000:]}"
    )
    summary = json.loads(lines[-1])
    failures = {k: v["failure"] for k, v in summary.items() if "failure" in v}
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert out.returncode == 0, out.stderr[-3000:]
    return summary


def test_every_generated_call_is_refused_by_name_or_equals_the_model(tmp_path):
    summary = _run(tmp_path, "cpu")
    total = sum(v["cases"] for v in summary.values())
    print("fuzz cases:", {k: v["cases"] for k, v in summary.items()}, "total", total)
    if float(os.environ.get("DEMB_FUZZ_SCALE", "1")) >= 1:
        assert total >= MIN_CASES, summary


@pytest.mark.gpu
def test_every_generated_call_on_cuda_is_refused_by_name_or_equals_the_model(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from dynamicemb.table import extension

    if not extension().cuda_built():
        pytest.skip("dynamicemb built without CUDA")
    _run(tmp_path, "cuda", CUDA_TARGETS)
