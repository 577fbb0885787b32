"""examples/quickstart.py, the public-API script the wheel check runs in a fresh
venv, runs here too; the sharded model it builds carries its dynamic table's
rows in its state_dict(), through torch.save and load_state_dict too."""

import os
import subprocess
import sys
import textwrap

from tests.packaging.repo_files import checkout_with_extension, repo_root


def _run(args, **kwargs):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(repo_root()), str(repo_root() / "examples")])
    )
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, **kwargs
    )


def test_quickstart_trains_dumps_and_loads(tmp_path):
    # As README.md writes it: `python examples/quickstart.py`, nothing on
    # PYTHONPATH, dynamicemb not installed (examples/checkout.py finds it).
    checkout = checkout_with_extension(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        [sys.executable, str(checkout / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert ran.stdout.strip().endswith("quickstart: OK")
    # Quiet where the library is concerned: the topology and the planner say
    # nothing, nor TorchRec's check of the dynamic table's raw ids.
    for said in ("TopologyFactory", "StorageReservation", "dense_tensor_estimate", "has range"):
        assert said not in ran.stderr, ran.stderr[-3000:]


def test_the_sharded_models_state_dict_carries_the_dynamic_rows():
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
        probe = quickstart.batch(torch.device("cpu"), 0)
        model(probe)["u"].sum().backward()  # rows for the probe's users
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = model.state_dict()
        print("WARNINGS", [str(w.message) for w in caught if "dynamic" in str(w.message)])
        print("KEYS", sorted(state))
        torch.save(state, os.path.join(tmp, "model.pt"))
        fresh = quickstart.build(torch.device("cpu"))
        fresh.load_state_dict(torch.load(os.path.join(tmp, "model.pt"), weights_only=False))
        model.eval(), fresh.eval()
        with torch.no_grad():
            same = torch.equal(model(probe)["u"], fresh(probe)["u"])
            same_item = torch.equal(model(probe)["i"], fresh(probe)["i"])
        print("SAME", same, same_item)
        dist.destroy_process_group()
        """
    )
    ran = _run(["-c", script])
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "WARNINGS []" in ran.stdout, ran.stdout
    keys = next(line for line in ran.stdout.splitlines() if line.startswith("KEYS"))
    assert "embedding_bags.item.weight" in keys and "embedding_bags.user.dynamicemb_rows" in keys
    assert "SAME True True" in ran.stdout, ran.stdout


def test_examples_set_no_process_wide_warning_filter():
    """A filter set at a script's top level hides every library's warnings from
    the program that copies it; the examples show what they warn instead."""
    import ast

    found = []
    for script in sorted((repo_root() / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("filterwarnings", "simplefilter", "resetwarnings"):
                    found.append(f"{script.name}:{node.lineno}")
    assert len(list((repo_root() / "examples").glob("*.py"))) >= 10
    assert found == []
