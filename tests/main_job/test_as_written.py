"""`python examples/train_dlrm.py`, as README.md writes it: nothing on PYTHONPATH and
dynamicemb not installed, from another folder; the job's ranks (processes it starts
itself) import the checkout's dynamicemb (examples/checkout.py) and train."""

import os
import subprocess
import sys

from tests.packaging.repo_files import checkout_with_extension


def test_the_job_runs_as_the_readme_writes_it(tmp_path):
    checkout = checkout_with_extension(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    args = "--device cpu --steps 4 --batch-size 32 --eval-batches 1 --log-window 2".split()
    ran = subprocess.run(
        [sys.executable, str(checkout / "examples" / "train_dlrm.py"), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = ran.stdout + ran.stderr
    assert "No module named 'dynamicemb'" not in out, out[-3000:]
    assert ran.returncode in (0, 1), out[-3000:]  # 1: a loss that did not fall in 4 steps
    assert "dynamic tables (summed over ranks)" in out, out[-3000:]
