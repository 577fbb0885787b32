"""The delta stream under faults: followers always hold exactly one run's
rows at one sequence.

One gloo process runs a publisher of two tables that evict and erase, and
followers by key:

* a publish failing at each file-system operation it makes (``OSError``,
  a full disk; ``stream_faults.Faults``) leaves the folder, the tables'
  sequences and the publisher as they were, and the next publish (same
  number) carries the removed keys the failed one drained;
* an ``incremental_dump`` of one table between publishes leaves the
  publisher working (publish and checkpoint);
* a follower joining late loads the checkpoint and catches up;
* a trainer restarted from the stream's checkpoint publishes a new epoch:
  a follower past the checkpoint reloads it, one at the checkpoint switches
  epochs without it;
* a model of another run is refused as a publisher, and a delta of another
  run copied into the stream is refused by the follower, which is left as
  it was;
* publishers SIGKILLed in a publish (in the middle of its operations and at
  its last, the delta renamed into place) leave complete deltas only, and a
  trainer restarted from the checkpoint continues in a new epoch.

After every poll, each follower's tables equal the trainer's (or the
restarted trainer's) at the run, epoch and sequence the follower reports.
"""

import os
import shutil

import pytest

from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.replication import stream_faults as sf
from tests.shard import shard_harness as h

CASE = sf.CASE
ERASE_EVERY = 4


class Trainer:
    """A model with its publisher, and its tables after every publish by
    (run, epoch, sequence)."""

    def __init__(self, folder: str, history: dict, load_from: str | None = None, first: int = 0):
        from dynamicemb.checkpoint import load
        from dynamicemb.replication import DeltaPublisher

        self.model = c.build(CASE, 1)
        if load_from is not None:
            load(load_from, self.model, optim=True, show_progress=False)
        self.pub = DeltaPublisher(self.model, folder)
        self.history = history
        self.first = first
        self.step = 0
        self.record()

    @property
    def position(self):
        return (self.pub.run, self.pub.epoch, self.pub.sequence)

    def record(self) -> None:
        self.history[self.position] = c.contents(self.model)

    def train(self) -> None:
        from dynamicemb.replication import erase_keys

        sf.train_step(self.model, self.step, self.first)
        if self.step % ERASE_EVERY == ERASE_EVERY - 1:
            erase_keys(self.model, {r.COLL: {t: r.erase_batch(self.step) for t in CASE.dynamic}})
        self.step += 1

    def publish(self) -> int:
        seq = self.pub.publish()
        self.record()
        return seq

    def checkpoint(self) -> None:
        self.pub.checkpoint(optim=True)


def _follower(folder):
    from dynamicemb.replication import DeltaFollower

    model = c.build(r.replica_case(CASE), 1)
    model.eval()
    return DeltaFollower(model, folder)


def _assert_holds_one_run(follower, history, what):
    run, epoch, seq = follower.position
    if run is None:  # nothing applied yet
        assert seq == 0 and all(not t["keys"].numel() for t in c.contents(follower.model).values())
        return
    assert (run, epoch, seq) in history, (what, follower.position, sorted(history))
    r.assert_replica_equals(
        c.contents(follower.model), history[(run, epoch, seq)], CASE.score_strategy, what
    )


def _poll(follower, history, what):
    applied = follower.poll()
    _assert_holds_one_run(follower, history, what)
    return applied


def _folder_state(folder, trainer):
    from dynamicemb.replication.stream import list_stream

    return {
        "listed": list_stream(folder),
        "entries": sorted(os.listdir(folder)),
        "tables": [list(k.emb_module.rows.delta_sequence) for k in c.kernels(trainer.model)],
        "position": trainer.position,
        "threshold": trainer.pub.threshold,
    }


def _failed_publishes(trainer, follower, history, folder):
    """A publish failing at each of its file-system operations."""
    probe = sf.Faults()
    trainer.train()
    with probe.installed():
        trainer.publish()
    _poll(follower, history, "probe")
    ops = probe.count
    assert ops > 20, probe.seen
    published = []
    for at in range(ops):
        trainer.train()
        before = _folder_state(folder, trainer)
        try:
            with sf.Faults(at=at).installed():
                trainer.pub.publish()
        except OSError as e:
            assert "injected" in str(e)
            assert _folder_state(folder, trainer) == before, f"operation {at} ({probe.seen[at]})"
            assert _poll(follower, history, f"after failure {at}") == []
            seq = trainer.publish()
        else:  # failed after the delta was in place: published
            published.append(at)
            trainer.record()
            seq = trainer.pub.sequence
        assert seq == before["position"][2] + 1
        assert _poll(follower, history, f"after failure {at} and a publish") == [seq]
    # Only what follows the rename that puts the delta in place.
    assert published == list(range(probe.seen.index("rename") + 1, ops)), probe.seen
    return ops


def _in_process(rank, world, root):
    from dynamicemb.incremental_dump import incremental_dump
    from dynamicemb.replication import DeltaError, DeltaPublisher

    folder = os.path.join(root, "stream")
    history = {}
    trainer = Trainer(folder, history)
    trainer.checkpoint()
    a = _follower(folder)
    _poll(a, history, "start")
    ops = _failed_publishes(trainer, a, history, folder)
    # A dump of one table outside the stream (nothing changed since the last
    # publish: it drains nothing the stream needs).
    incremental_dump(trainer.model, {r.COLL: {"t0": 0}})
    trainer.train()
    seq = trainer.publish()
    _poll(a, history, "after a dump of one table")
    trainer.checkpoint()
    late = _follower(folder)
    _poll(late, history, "late")
    assert late.loaded_checkpoint and late.sequence == seq
    # b stops at the checkpoint; a goes on past it.
    b = _follower(folder)
    _poll(b, history, "b")
    for _ in range(2):
        trainer.train()
        trainer.publish()
    _poll(a, history, "a past the checkpoint")
    # The trainer dies; another, restarted from the checkpoint, trains on
    # other batches: a new epoch from the checkpoint's sequence.
    old = trainer.position
    again = Trainer(folder, history, load_from=os.path.join(folder, "checkpoint"), first=1000)
    assert again.pub.run == old[0] and again.pub.epoch == old[1] + 1
    assert again.pub.sequence == seq
    for _ in range(3):
        again.train()
        again.publish()
    assert _poll(a, history, "a after the restart") == [seq + 1, seq + 2, seq + 3]
    assert a.position == again.position
    b_loaded = b.loaded_checkpoint
    assert _poll(b, history, "b after the restart") == [seq + 1, seq + 2, seq + 3]
    assert b.loaded_checkpoint == b_loaded  # switched epochs without the checkpoint
    # Another model of the same configuration: refused as a publisher ...
    other = c.build(CASE, 1)
    with pytest.raises(DeltaError, match="holds the delta stream of run"):
        DeltaPublisher(other, folder)
    # ... and its delta, copied into this stream as the next one, refused.
    foreign = os.path.join(root, "foreign")
    pub = DeltaPublisher(other, foreign)
    sf.train_step(other, 0)
    for _ in range(seq + 4):
        pub.publish()
    from dynamicemb.replication.stream import delta_path

    copied = delta_path(folder, seq + 4, again.pub.epoch)
    shutil.copytree(delta_path(foreign, seq + 4, 0), copied)
    before = a.position
    with pytest.raises(DeltaError, match="foreign"):
        a.poll()
    assert a.position == before
    _assert_holds_one_run(a, history, "a after the foreign delta")
    shutil.rmtree(copied)
    # A checkpoint of the new epoch prunes every delta of the old one.
    again.checkpoint()
    from dynamicemb.replication.stream import list_stream

    assert list_stream(folder) == []
    return {"ops": ops}


def _restarts_after_kills(rank, world, folders):
    """The killed publishers' folders: complete deltas only; a restarted
    trainer continues them in a new epoch, and followers follow it."""
    from dynamicemb.replication.stream import delta_path, list_stream, read_delta

    out = {}
    for where, folder in folders.items():
        listed = list_stream(folder)
        for epoch, seq in listed:
            read_delta(delta_path(folder, seq, epoch))  # every listed delta is whole
        # What the killed run published, followed before the restart.
        behind = _follower(folder)
        behind.poll()
        history = {}
        trainer = Trainer(folder, history, load_from=os.path.join(folder, "checkpoint"), first=500)
        fresh = _follower(folder)
        for _ in range(2):
            trainer.train()
            trainer.publish()
        for name, f in (("behind", behind), ("fresh", fresh)):
            _poll(f, history, f"{where}: {name}")
            assert f.position == trainer.position, (where, name)
        out[where] = {"listed": listed, "epoch": trainer.pub.epoch}
    return out


def test_the_stream_under_faults(tmp_path):
    folders = {w: str(tmp_path / f"killed-{w}") for w in ("middle", "last")}
    kids = [h.Process(sf.main, folder, where) for where, folder in folders.items()]
    (out,) = h.run_world(_in_process, 1, str(tmp_path))
    assert out["ops"] > 20
    for kid in kids:
        code, log = kid.join(timeout=120)
        assert code == -9, log[-2000:]
    (killed,) = h.run_world(_restarts_after_kills, 1, folders)
    clean = list(range(1, sf.CLEAN + 1))
    assert killed["middle"]["listed"] == [(0, s) for s in clean]
    assert killed["last"]["listed"] == [(0, s) for s in clean + [sf.CLEAN + 1]]
    for where in folders:
        assert killed[where]["epoch"] == 1
        leftovers = [n for n in os.listdir(folders[where]) if ".dynamicemb-tmp-" in n]
        assert leftovers == [] or where == "middle", leftovers


def test_faults_count_every_write(tmp_path):
    """The injection sees a write the stream makes: a failing write raises."""
    p = str(tmp_path / "f")
    with sf.Faults(at=1).installed() as faults:
        from dynamicemb.io import fs

        f = fs.of(p).open_write(p)
        with pytest.raises(OSError, match="operation 1: write"):
            f.write(b"x")
        f.close()
    assert faults.seen == ["open_write", "write"]
