"""examples/quickstart.py, the public-API script the wheel check runs in a fresh
venv, runs here too; the sharded model it builds warns once that its
state_dict() lacks the dynamic table's rows."""

import os
import subprocess
import sys
import textwrap

from tests.packaging.repo_files import repo_root


def _run(args, **kwargs):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(repo_root()), str(repo_root() / "examples")])
    )
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, **kwargs
    )


def test_quickstart_trains_dumps_and_loads():
    ran = _run([str(repo_root() / "examples" / "quickstart.py")])
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert ran.stdout.strip().endswith("quickstart: OK")


def test_the_sharded_models_state_dict_warns_once():
    script = textwrap.dedent(
        """
        import os, tempfile, warnings
        import torch, torch.distributed as dist
        import quickstart

        tmp = tempfile.mkdtemp()
        dist.init_process_group(
            "gloo", init_method="file://" + os.path.join(tmp, "r"), rank=0, world_size=1
        )
        model = quickstart.build(torch.device("cpu"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            keys = list(model.state_dict())
            model.state_dict()
        ours = [str(w.message) for w in caught if "DynamicEmbStateful" in str(w.message)]
        print("WARNINGS", len(ours))
        print("KEYS", keys)
        dist.destroy_process_group()
        """
    )
    ran = _run(["-c", script])
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "WARNINGS 1" in ran.stdout, ran.stdout
    keys = next(line for line in ran.stdout.splitlines() if line.startswith("KEYS"))
    assert "item" in keys and ".user." not in keys  # the static table is there, the dynamic not
