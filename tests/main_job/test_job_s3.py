"""The main job with an s3:// --checkpoint-dir (moto's server through
s3fs): killed with SIGKILL in a step after its first checkpoint, restarted
with --resume, it goes on from the checkpoint in the bucket and ends with
the same tables, parameters and optimizer states, bit for bit, as an
uninterrupted run with a local folder; a bucket that does not exist is a
clear error before the job starts."""

import os

import fsspec
import job_harness as j
import train_checkpoint  # examples/train_checkpoint.py

from tests.object_store import s3_server

s3 = s3_server.s3  # the endpoint, a fixture

STEPS, EVERY = 12, 6
ARGS = [*j.SMALL, "--world-size", "1", "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]


def _job(root: str, *more: str) -> tuple[int, str]:
    return j.run_job([*ARGS, "--checkpoint-dir", root, *more])


def test_killed_then_resumed_from_a_bucket_equals_the_uninterrupted_run(s3, tmp_path):
    local = str(tmp_path / "local")
    rc, out = _job(local, "--summary-json", str(tmp_path / "ref.json"))
    assert rc == 0, out[-4000:]

    url = s3.bucket() + "/runs/dlrm"
    rc, out = _job(url, "--crash-at", "step:9:0")
    assert rc != 0 and "--crash-at step:9:0: SIGKILL" in out, out[-4000:]
    assert j.steps_in(url) == [6]
    rc, out = _job(url, "--resume", "--summary-json", str(tmp_path / "s3.json"))
    assert rc == 0, out[-4000:]
    assert f"resumed from {url}/step_00000006/.dynamicemb-version-00000001" in out
    assert j.steps_in(url) == [6, 12]
    s = j.summary(str(tmp_path / "s3.json"))
    assert s["resumed"]["step"] == 6 and s["steps_run"] == STEPS - 6
    j.assert_same_figures(s, j.summary(str(tmp_path / "ref.json")), "resumed from s3")

    # The final checkpoint, copied out of the bucket, equals the local one.
    (found,) = [f for f in train_checkpoint.complete(url) if f.step == STEPS]
    copy = str(tmp_path / "copy")
    fsspec.filesystem("s3").get(found.path + "/", copy + "/", recursive=True)
    tables = os.path.join(copy, train_checkpoint.TABLES)
    (version,) = os.listdir(tables)  # the dump's own committed version
    for name in os.listdir(os.path.join(tables, version)):
        os.rename(os.path.join(tables, version, name), os.path.join(tables, name))
    got = j.read_checkpoint(copy, str(tmp_path))
    want = j.read_checkpoint(train_checkpoint.step_dir(local, STEPS), str(tmp_path))
    j.assert_same_state(got, want, "resumed from s3")


def test_a_missing_bucket_is_refused_before_the_job_starts(s3):
    rc, out = _job("s3://no-such-bucket-here/run")
    assert rc != 0
    assert "--checkpoint-dir s3://no-such-bucket-here/run: cannot be written" in out, out[-2000:]
