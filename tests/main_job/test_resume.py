"""Checkpoints of the main job that survive a kill: a rank SIGKILLed during
a step, during a checkpoint (the tables written, nothing published) and
right after publishing, each time restarted with --resume, ends with the
same tables, parameters and optimizer states, bit for bit, as the run that
was never interrupted (the job is deterministic given its seed: batch
(step, rank) depends on nothing else); torchrun's --max-restarts does the
restart by itself; a checkpoint reloads at other world sizes."""

import os
import shutil

import job_harness as j
import pytest
import torch
import train_checkpoint  # examples/train_checkpoint.py (pyproject: pytest pythonpath)

from tests.shard import shard_harness as h

STEPS, EVERY, KEEP = 30, 10, 2
ARGS = j.SMALL + f"--steps {STEPS} --checkpoint-every {EVERY}".split()


def _job(root: str, *more: str) -> tuple[int, str]:
    return j.run_job(
        [*ARGS, "--world-size", "2", "--checkpoint-dir", root, "--keep", str(KEEP), *more]
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its folder, summary and final checkpoint."""
    tmp = tmp_path_factory.mktemp("reference")
    root = str(tmp / "ckpt")
    rc, out = _job(root, "--keep", "0", "--summary-json", str(tmp / "summary.json"))
    assert rc == 0, out[-4000:]
    assert j.steps_in(root) == [10, 20, 30]
    final = j.read_checkpoint(train_checkpoint.step_dir(root, STEPS), str(tmp))
    return root, j.summary(str(tmp / "summary.json")), final


def _leftovers(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if ".dynamicemb-tmp-" in n)


def test_killed_three_times_then_resumed_equals_the_uninterrupted_run(reference, tmp_path):
    ref_root, ref_summary, ref_final = reference
    root = str(tmp_path / "ckpt")

    # Rank 1 dies in step 15 (its tables updated by the backward pass, the
    # dense step not taken): the checkpoint of step 10 is the newest.
    rc, out = _job(root, "--crash-at", "step:15:1")
    assert rc != 0 and "--crash-at step:15:1: SIGKILL" in out, out[-4000:]
    assert j.steps_in(root) == [10]

    # Rank 0 dies in the checkpoint of step 20 after the tables were
    # written: an unfinished folder, not a checkpoint.
    rc, out = _job(root, "--resume", "--crash-at", "dump:20:0")
    assert rc != 0 and "--crash-at dump:20:0: SIGKILL" in out, out[-4000:]
    assert "resumed from" in out and "step_00000010 (after step 10" in out
    assert j.steps_in(root) == [10]
    assert len(_leftovers(root)) == 1 and _leftovers(root)[0].startswith("step_00000020.")

    # Rank 0 dies right after publishing step 20 (before pruning).
    rc, out = _job(root, "--resume", "--crash-at", "published:20:0")
    assert rc != 0 and "--crash-at published:20:0: SIGKILL" in out, out[-4000:]
    assert "step_00000010 (after step 10" in out
    assert j.steps_in(root) == [10, 20] and _leftovers(root) == []

    # The last restart goes on from step 20 to the end and prunes to --keep.
    summary = str(tmp_path / "summary.json")
    rc, out = _job(root, "--resume", "--summary-json", summary)
    assert rc == 0, out[-4000:]
    assert j.steps_in(root) == [20, 30]
    s = j.summary(summary)
    assert s["resumed"]["step"] == 20 and s["start_step"] == 20 and s["steps_run"] == 10
    assert s["resumed"]["rows_dropped"] == dict.fromkeys(s["tables"], 0)

    got = j.read_checkpoint(train_checkpoint.step_dir(root, STEPS), str(tmp_path))
    j.assert_same_state(got, ref_final, "killed and resumed")
    j.assert_same_figures(s, ref_summary, "killed and resumed")


def test_torchrun_max_restarts_resumes_by_itself(reference, tmp_path):
    _, ref_summary, ref_final = reference
    root = str(tmp_path / "ckpt")
    summary = str(tmp_path / "summary.json")
    rc, out = j.run_torchrun(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"],
        [*ARGS, "--checkpoint-dir", root, "--resume", "--crash-at", "step:15:1"]
        + ["--summary-json", summary],
    )
    assert rc == 0, out[-6000:]
    assert "--crash-at step:15:1: SIGKILL" in out
    assert "--resume: no checkpoint in" in out  # the first attempt started at step 0
    s = j.summary(summary)
    assert s["resumed"]["step"] == 10 and s["eval_loss_final"] == ref_summary["eval_loss_final"]
    got = j.read_checkpoint(train_checkpoint.step_dir(root, STEPS), str(tmp_path))
    j.assert_same_state(got, ref_final, "restarted by torchrun")


# -------------------------------------------------- another world size --


def _reload(rank: int, world: int, src: str, dst: str) -> list:
    """Loads ``src``'s checkpoint into the job's model at this world size,
    as a resume does, and saves it again into ``dst``."""
    import dist_launch
    import train_dlrm

    args = train_dlrm.parse_args([*j.SMALL, "--world-size", str(world), "--steps", str(STEPS)])
    cpu = torch.device("cpu")
    source = train_dlrm.DataSource(args)
    model, _, dense_opt = train_dlrm.build(source.features, args, dist_launch.rank_env(), cpu)
    checkpoints = train_checkpoint.JobCheckpoints(dst, 0, cpu)
    found = train_checkpoint.complete(src)[-1]
    trainer, report = checkpoints.load(found, model, dense_opt)
    body = {k: found.manifest[k] for k in ("model", "data", "batch_size")}
    checkpoints.save(found.step, model, dense_opt, trainer, body)
    return [(t.table, t.checkpoint_rows, t.loaded, t.dropped) for t in report.tables]


@pytest.mark.parametrize("world", [1, 3])
def test_a_checkpoint_reloads_at_another_world_size(reference, tmp_path, world):
    """Dense parameters, static tables and optimizer states reshard exactly;
    every dynamic row that fits is there unchanged, and the load reports the
    rest (only the full, evicting table can overflow a bucket)."""
    ref_root, _, ref_final = reference
    src = str(tmp_path / "src")
    shutil.copytree(
        train_checkpoint.step_dir(ref_root, STEPS), train_checkpoint.step_dir(src, STEPS)
    )
    dst = str(tmp_path / "dst")
    reports = h.run_world(_reload, world, src, dst)
    got = j.read_checkpoint(train_checkpoint.step_dir(dst, STEPS), str(tmp_path))
    assert got["manifest"]["world_size"] == world
    for k, w in ref_final["torchrec"].items():
        assert torch.equal(got["torchrec"][k], w), k
    for k, w in ref_final["dense_optim"].items():
        assert torch.equal(torch.as_tensor(got["dense_optim"][k]), torch.as_tensor(w)), k
    assert torch.equal(got["loss_sum"], ref_final["loss_sum"])
    for table, rows, loaded, dropped in reports[0]:
        want, have = ref_final["tables"][table], got["tables"][table]
        assert rows == want["keys"].numel() and loaded == have["keys"].numel()
        assert loaded + dropped == rows, table
        if table != "t_item":  # room for every row: nothing may be lost
            assert dropped == 0, table
        kept = torch.isin(want["keys"], have["keys"])
        assert int(kept.sum()) == loaded, table
        for c in ("emb", "opt", "scores"):
            assert torch.equal(have[c], want[c][kept]), (table, c)


def test_a_resume_at_another_world_size_keeps_the_loss_history(reference, tmp_path):
    """The steps before a resume at another world size keep their mean
    losses: the summary's first window and first report equal the
    uninterrupted run's."""
    ref_root, ref_summary, _ = reference
    root = str(tmp_path / "ckpt")
    shutil.copytree(
        train_checkpoint.step_dir(ref_root, EVERY), train_checkpoint.step_dir(root, EVERY)
    )
    summary = str(tmp_path / "summary.json")
    argv = [*ARGS, "--world-size", "1", "--checkpoint-dir", root, "--resume"]
    rc, out = j.run_job([*argv, "--summary-json", summary])
    assert rc == 0, out[-4000:]
    s = j.summary(summary)
    assert s["resumed"]["world_size"] == 2 and s["world_size"] == 1
    assert s["train_loss_first"] == ref_summary["train_loss_first"]
    assert s["train_loss_checkpoints"][0] == ref_summary["train_loss_checkpoints"][0]


def _craft(step_path: str, marker: str) -> None:
    """Replaces the checkpoint's DCP metadata with a pickle that would call
    open(marker), and records the new file in job.json (its CRC-32s are
    anyone's to recompute)."""
    import json
    import pickle

    from dynamicemb.io.files import encode_manifest

    class Payload:
        def __reduce__(self):
            return (open, (marker, "w"))

    folder = os.path.join(step_path, train_checkpoint.TORCHREC)
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        f.write(pickle.dumps(Payload()))
    manifest = os.path.join(step_path, train_checkpoint.MANIFEST)
    with open(manifest) as f:
        body = json.load(f)
    del body["checksum"]
    body["torchrec"] = train_checkpoint._file_infos(folder)
    with open(manifest, "wb") as f:
        f.write(encode_manifest(body))


def test_a_crafted_newest_checkpoint_runs_nothing_and_the_job_goes_on_from_the_older(
    reference, tmp_path
):
    """The newest checkpoint's DCP folder holds a pickle that would run code:
    --resume reads it without running anything, names it, and goes on from
    the older complete checkpoint, ending as the uninterrupted run."""
    ref_root, ref_summary, ref_final = reference
    root = str(tmp_path / "ckpt")
    for step in (EVERY, 2 * EVERY):
        src = train_checkpoint.step_dir(ref_root, step)
        shutil.copytree(src, train_checkpoint.step_dir(root, step))
    marker = str(tmp_path / "ran")
    _craft(train_checkpoint.step_dir(root, 2 * EVERY), marker)
    rc, out = _job(root, "--resume")
    assert rc == 0, out[-4000:]
    assert not os.path.exists(marker)
    assert f"--resume: cannot load {train_checkpoint.step_dir(root, 2 * EVERY)}" in out
    assert "asks for io.open" in out
    assert "step_00000010 (after step 10" in out
    got = j.read_checkpoint(train_checkpoint.step_dir(root, STEPS), str(tmp_path))
    j.assert_same_state(got, ref_final, "resumed from the older checkpoint")


def test_a_damaged_newest_checkpoint_is_named_and_the_job_goes_on_from_the_older(
    reference, tmp_path
):
    """A byte of the newest checkpoint's trainer.pt flipped (the CRC-32 that
    job.json records no longer matches): --resume names the checkpoint and the
    file, and goes on from the older complete checkpoint, ending as the
    uninterrupted run."""
    ref_root, _, ref_final = reference
    root = str(tmp_path / "ckpt")
    for step in (EVERY, 2 * EVERY):
        src = train_checkpoint.step_dir(ref_root, step)
        shutil.copytree(src, train_checkpoint.step_dir(root, step))
    newest = train_checkpoint.step_dir(root, 2 * EVERY)
    trainer = os.path.join(newest, train_checkpoint.TRAINER)
    with open(trainer, "r+b") as f:
        f.seek(os.path.getsize(trainer) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    rc, out = _job(root, "--resume")
    assert rc == 0, out[-4000:]
    assert f"--resume: cannot load {newest}" in out, out[-4000:]
    assert train_checkpoint.TRAINER in out, out[-4000:]
    assert "step_00000010 (after step 10" in out
    got = j.read_checkpoint(train_checkpoint.step_dir(root, STEPS), str(tmp_path))
    j.assert_same_state(got, ref_final, "resumed from the older checkpoint")
