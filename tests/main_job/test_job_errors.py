"""The main job refuses what it cannot do with an error that names the
problem, before any rank starts and without touching the checkpoints: a
missing data path, a checkpoint folder that is a file or already holds
checkpoints, a checkpoint of another model or other data, fewer steps than
the checkpoint has done, a world size that is not torchrun's. Incomplete
checkpoints are never resumed from."""

import os
import shutil

import job_harness as j
import pytest
import train_checkpoint  # examples/train_checkpoint.py (pyproject: pytest pythonpath)
import train_dlrm  # examples/train_dlrm.py

TINY = [*j.SMALL, "--world-size", "1", "--batch-size", "16", "--steps", "2"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A folder with the checkpoints of steps 1 and 2 of a tiny run."""
    root = str(tmp_path_factory.mktemp("errors") / "ckpt")
    rc, out = j.run_job([*TINY, "--checkpoint-dir", root, "--checkpoint-every", "1"])
    assert rc in (0, 1), out[-4000:]
    assert j.steps_in(root) == [1, 2]
    return root


def _refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        train_dlrm.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), ("cannot go on", 1)])
def test_a_main_run_here_ends_with_the_status_its_command_line_would(code, status):
    def main(argv):
        raise SystemExit(code)

    rc, out = j.run_main(main, [])
    assert rc == status
    assert ("cannot go on" in out) == (code == "cannot go on")


def _snapshot(root: str) -> dict[str, tuple[int, int]]:
    out = {}
    for folder, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(folder, n))
            out[os.path.relpath(os.path.join(folder, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_bad_paths_are_named(capsys, tmp_path):
    missing = str(tmp_path / "nowhere")
    assert f"{missing}: no such file or folder" in _refused(capsys, [*TINY, "--data", missing])
    (tmp_path / "a_file").write_text("x")
    err = _refused(capsys, [*TINY, "--checkpoint-dir", str(tmp_path / "a_file")])
    assert f"--checkpoint-dir {tmp_path / 'a_file'}: exists and is not a folder" in err
    err = _refused(capsys, [*TINY, "--summary-json", str(tmp_path / "no" / "s.json")])
    assert f"the folder {tmp_path / 'no'} does not exist" in err
    assert "--eval-data needs --data" in _refused(capsys, [*TINY, "--eval-data", missing])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
        (["--crash-at", "step:1"], "--crash-at needs --checkpoint-dir"),
    ],
)
def test_checkpoint_options_need_a_folder(capsys, flags, message):
    assert message in _refused(capsys, [*TINY, *flags])


def test_a_bad_crash_point_is_named(capsys, tmp_path):
    err = _refused(capsys, [*TINY, "--checkpoint-dir", str(tmp_path), "--crash-at", "later:3"])
    assert "'later:3' is not POINT:STEP[:RANK] with POINT one of step, dump, published" in err


def test_a_folder_with_checkpoints_needs_resume(capsys, checkpoints):
    err = _refused(capsys, [*TINY, "--checkpoint-dir", checkpoints])
    assert f"--checkpoint-dir {checkpoints} holds checkpoints (the newest after step 2)" in err
    assert "pass --resume" in err
    err = _refused(capsys, [*TINY, "--checkpoint-dir", checkpoints, "--resume", "--steps", "1"])
    assert "--steps 1: the newest checkpoint" in err and "is after step 2 already" in err


@pytest.mark.parametrize(
    "flags, differences",
    [
        (["--dim", "8"], ["model.dim: 16 (checkpoint) vs 8 (this job)", "model.bottom_mlp"]),
        (["--seed", "1"], ["data.seed: 0 (checkpoint) vs 1 (this job)"]),
        (
            ["--alpha", "1.2"],
            ["data.alpha: 1.05 (checkpoint) vs 1.2 (this job)"],
        ),
    ],
)
def test_a_checkpoint_of_another_model_or_data_is_refused(capsys, checkpoints, flags, differences):
    err = _refused(capsys, [*TINY, "--checkpoint-dir", checkpoints, "--resume", *flags])
    assert "is of another model or data than this job" in err
    for d in differences:
        assert d in err


def test_another_model_leaves_the_checkpoints_as_they_were(checkpoints, tmp_path):
    """The whole job, not only its argument check: exit status 2, the
    differences named, not a file of the folder touched."""
    before = _snapshot(checkpoints)
    rc, out = j.run_job([*TINY, "--checkpoint-dir", checkpoints, "--resume", "--dim", "8"])
    assert rc == 2
    assert "is of another model or data" in out and "model.dim: 16 (checkpoint) vs 8" in out
    assert _snapshot(checkpoints) == before


def test_a_table_of_another_size_is_another_model(tmp_path, capsys):
    data = tmp_path / "data.tsv"
    data.write_text(("1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["a1"] * 26) + "\n") * 4)
    root = str(tmp_path / "ckpt")
    argv = [*TINY, "--steps", "1", "--data", str(data), "--checkpoint-dir", root]
    rc, out = j.run_job([*argv, "--table-capacity", "1024"])
    assert rc in (0, 1) and j.steps_in(root) == [1], out[-4000:]
    err = _refused(capsys, [*argv, "--resume", "--table-capacity", "2048"])
    assert "model.tables.t_c1.capacity: 1024 (checkpoint) vs 2048 (this job)" in err
    err = _refused(capsys, [*argv, "--resume", "--table-capacity", "1024", "--id-format", "int"])
    assert "data.id_format: hex (checkpoint) vs int (this job)" in err
    train_dlrm.parse_args([*argv, "--resume", "--table-capacity", "1024"])  # the same: accepted


def test_incomplete_checkpoints_are_not_resumed_from(checkpoints, tmp_path):
    root = str(tmp_path / "ckpt")
    shutil.copytree(checkpoints, root)
    assert j.steps_in(root) == [1, 2]
    newest = train_checkpoint.step_dir(root, 2)
    with open(os.path.join(newest, train_checkpoint.MANIFEST), "r+b") as f:
        f.seek(20)
        f.write(b"#")  # a torn or corrupted manifest
    assert j.steps_in(root) == [1]
    os.remove(os.path.join(newest, train_checkpoint.MANIFEST))
    assert j.steps_in(root) == [1]
    os.rename(newest, newest + ".dynamicemb-tmp-1")  # an unfinished save
    assert j.steps_in(root) == [1]


def test_world_size_under_torchrun_is_torchruns(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = _refused(capsys, [*j.SMALL, "--world-size", "3"])
    assert "--world-size 3 differs from the launcher's WORLD_SIZE 2" in err
    assert train_dlrm.parse_args(j.SMALL).world_size == 2


def test_a_folder_another_job_writes_is_refused_and_a_dead_jobs_lock_taken_over(tmp_path):
    import json
    import socket
    import subprocess
    import sys

    root = tmp_path / "ckpt"
    root.mkdir()
    lock = root / train_checkpoint.LOCK
    # A live job: this process.
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": 0}))
    before = _snapshot(str(root))
    rc, out = j.run_job([*TINY, "--checkpoint-dir", str(root)])
    assert rc == 2, out[-4000:]
    assert f"--checkpoint-dir {root} is in use by another job" in out
    assert f"process {os.getpid()}" in out and str(lock) in out
    assert _snapshot(str(root)) == before
    # A job that is gone (its process ended): taken over, and released at the end.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], text=True, capture_output=True
    ).stdout.strip()
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone), "started": 0}))
    rc, out = j.run_job([*TINY, "--checkpoint-dir", str(root)])
    assert rc in (0, 1), out[-4000:]
    assert j.steps_in(str(root)) == [2] and not lock.exists()
