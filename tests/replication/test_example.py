"""The serving replica example (examples/serve_replica.py) runs as the README
says: its demo trains on two gloo processes publishing a delta per step, a
replica (an inference table of INT8 rows) follows them while answering
lookups, and ends holding every key of the job with the job's rows (the
bytes a table built from the job's final checkpoint holds)."""

import os
import re
import subprocess
import sys
from pathlib import Path


def _script() -> Path:
    # Bazel: the runfiles root is the working directory; by hand: the checkout.
    for root in (Path.cwd(), Path(__file__).parents[2]):
        path = root / "examples" / "serve_replica.py"
        if path.is_file():
            return path
    raise FileNotFoundError("examples/serve_replica.py")


def test_the_demo_replica_ends_equal_to_the_job(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(_script()), "demo", "--device", "cpu", "--steps", "12"]
        + ["--checkpoint-every", "5", "--batch-size", "128", "--folder", str(tmp_path / "s")]
        + ["--dtype", "int8"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "serve: stopped at delta 12" in out.stdout
    m = re.search(
        r"serve: the replica holds the job's (\d+) keys, max \|difference\| (\S+)", out.stdout
    )
    assert m, out.stdout[-2000:]
    assert int(m.group(1)) > 0 and float(m.group(2)) == 0.0
