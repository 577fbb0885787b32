"""The main job under torchrun: two torchrun "nodes" on 127.0.0.1 (the c10d
rendezvous, gloo, two processes each) train exactly as one launch of four
processes does (the same losses, AUC, tables, parameters and optimizer
states, bit for bit); the serving replica's trainer runs under torchrun
too."""

import os
import subprocess
import sys

import dist_launch  # examples/dist_launch.py (pyproject: pytest pythonpath)
import job_harness as j
import serve_replica  # examples/serve_replica.py
import train_checkpoint  # examples/train_checkpoint.py
import train_dlrm  # examples/train_dlrm.py

STEPS = 20
ARGS = j.SMALL + ["--steps", str(STEPS)]


def _two_nodes(root: str, summary: str) -> list[str]:
    port = dist_launch.free_port()
    rdzv = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    rdzv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]
    rdzv += ["--local-addr", "127.0.0.1"]
    argv = [*ARGS, "--checkpoint-dir", root, "--summary-json", summary]
    agents = [
        subprocess.Popen(
            j.torchrun_cmd(rdzv, argv),
            env=train_dlrm.job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outs = []
    try:
        for a in agents:
            out, _ = a.communicate(timeout=j.RUN_TIMEOUT_S)
            outs.append(out)
            assert a.returncode == 0, out[-6000:]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    return outs


def test_two_torchrun_nodes_equal_one_launch_of_the_same_world(tmp_path):
    nodes_root, nodes_summary = str(tmp_path / "nodes"), str(tmp_path / "nodes.json")
    outs = _two_nodes(nodes_root, nodes_summary)
    assert any("DLRM on 4 cpu process(es) on 2 nodes" in o for o in outs), outs[0][-3000:]

    one_root, one_summary = str(tmp_path / "one"), str(tmp_path / "one.json")
    rc, out = j.run_job(
        [*ARGS, "--world-size", "4", "--checkpoint-dir", one_root, "--summary-json", one_summary]
    )
    assert rc == 0, out[-4000:]

    nodes, one = j.summary(nodes_summary), j.summary(one_summary)
    assert nodes["world_size"] == one["world_size"] == 4
    assert nodes["nodes"] == 2 and one["nodes"] == 1
    j.assert_same_figures(nodes, one, "two nodes", more=("tables",))
    got = j.read_checkpoint(train_checkpoint.step_dir(nodes_root, STEPS), str(tmp_path))
    want = j.read_checkpoint(train_checkpoint.step_dir(one_root, STEPS), str(tmp_path))
    assert got["manifest"]["world_size"] == 4
    j.assert_same_state(got, want, "two torchrun nodes")


def test_the_replicas_trainer_under_torchrun(tmp_path):
    """The trainer of serve_replica.py as two torchrun ranks publishes deltas
    that a replica applies until it holds every row of the job."""
    folder = str(tmp_path / "stream")
    steps = 8
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [serve_replica.__file__, "train", "--folder", folder, "--device", "cpu"]
        + ["--steps", str(steps), "--batch-size", "128", "--checkpoint-every", "1000"],
        env=train_dlrm.job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=j.RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert os.path.isdir(os.path.join(folder, "final"))
    replica = subprocess.run(
        [sys.executable, serve_replica.__file__, "serve", "--folder", folder, "--device", "cpu"]
        + ["--until", str(steps), "--compare", "--timeout", "120"],
        env=train_dlrm.job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=j.RUN_TIMEOUT_S,
    )
    out = replica.stdout
    assert replica.returncode == 0, out[-4000:]
    assert "serve: loaded the checkpoint (delta 0)" in out
    assert f"serve: stopped at delta {steps}" in out
    assert "max |difference| 0.0" in out
