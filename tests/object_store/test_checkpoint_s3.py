"""DynamicEmbDump / DynamicEmbLoad to an s3:// URL (s3fs against moto's
server on 127.0.0.1): a round trip (tables, optimizer state, scores and
admission counters), a replaced checkpoint whose old version is removed, a
prefix of other objects refused; and a dump killed with SIGKILL before or
after one of its writes (the first, one in the middle of the data files,
the manifest, the removal of the previous version) leaves the previous
checkpoint or the new one whole, exactly as the write order says: the
previous one until the new manifest is stored, the new one after."""

import os
import signal
import threading

import pytest

from tests.checkpoint import ckpt_harness as c
from tests.object_store.s3_server import S3Server
from tests.shard import shard_harness as h

T = h.TableSpec
# A table with an admission counter (its files are in the checkpoint too).
CASE = c.Case(
    "s3",
    "ebc",
    [T("t0", 48, 8, dist_type="continuous"), T("t1", 96, 4, admit_threshold=2)],
    optimizer="rowwise_adagrad",
    key_range=(0, 200),
    batch_size=6,
    max_length=5,
)


def _state(model) -> dict:
    return {"tables": c.contents(model), "counters": c.counters(model)}


def _matches(got: dict, want: dict) -> bool:
    try:
        c.assert_same_tables(got["tables"], want["tables"])
        c.assert_same_counters(got["counters"], want["counters"])
    except AssertionError:
        return False
    return True


def test_a_prefix_holding_other_objects_is_refused(s3):
    import fsspec

    from dynamicemb.checkpoint import CheckpointError
    from dynamicemb.checkpoint.files import prepare_target, resolve

    url = s3.bucket() + "/other"
    fsspec.filesystem("s3").pipe_file(url + "/notes.txt", b"mine")
    with pytest.raises(ValueError, match="holds objects but no dynamicemb checkpoint"):
        prepare_target(url)
    with pytest.raises(CheckpointError, match="no dynamicemb checkpoint at .*no committed version"):
        resolve(url)
    with pytest.raises(ValueError, match="exists and is not a folder"):
        prepare_target(url + "/notes.txt")


# ------------------------------------------------------------------- kills --


class _Killer:
    """Kills the dumping child at its ``at``-th write, before the server
    handles it (``after``: once it is handled, as the response is sent)."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.paths: list[str] = []
        self.at, self.after, self.pid = None, False, None
        self.forked = threading.Event()
        server.before_write = self._write

    def _write(self, method: str, path: str) -> bool:
        self.paths.append(f"{method} {path}")
        if self.at is None or len(self.paths) != self.at:
            return False
        self.forked.wait(30)
        if not self.after:
            os.kill(self.pid, signal.SIGKILL)
            return True  # not handled: the write never happens
        self.server.after_write = lambda: os.kill(self.pid, signal.SIGKILL)
        return False

    def run(self, url, model, at=None, after=False) -> int:
        """Dumps ``model`` to ``url`` in a forked child; its wait status."""
        from dynamicemb.checkpoint import dump

        self.paths, self.at, self.after = [], at, after
        self.forked.clear()
        self.pid = os.fork()
        if self.pid == 0:
            done = False
            try:
                dump(url, model, optim=True, show_progress=False)
                done = True
            finally:
                os._exit(0 if done else 1)
        self.forked.set()
        _, status = os.waitpid(self.pid, 0)
        self.server.after_write = None
        return status


def _kill_dumps(rank, world):
    import torch

    from dynamicemb.checkpoint import load
    from dynamicemb.checkpoint.layout import MANIFEST
    from dynamicemb.io import files, fs

    torch.set_num_threads(1)
    server = S3Server()
    url = server.bucket() + "/ckpt"
    killer = _Killer(server)
    model, other = c.build(CASE, world), c.build(CASE, world)
    c.train(model, CASE, rank, steps=1)
    assert os.WEXITSTATUS(killer.run(url, model)) == 0
    old = _state(model)
    assert old["counters"]["t1"]["keys"].numel() > 0
    load(url, other, optim=True, show_progress=False)
    assert _matches(_state(other), old)
    c.train(model, CASE, rank, steps=1, first=1)
    assert os.WEXITSTATUS(killer.run(url, model)) == 0  # replaces the first one
    replaced = fs.of(url).listdir(url)
    writes = list(killer.paths)  # one dump's writes, in order
    manifest_at = next(i for i, p in enumerate(writes) if p.startswith("PUT") and MANIFEST in p)
    assert manifest_at == len(writes) - 2 and writes[-1].startswith("POST")  # then the clean-up
    load(url, other, optim=True, show_progress=False)
    old = _state(other)
    assert _matches(old, _state(model))
    outcomes = []
    last = len(writes)
    points = [(1, False), (last // 2, True), (last - 1, False), (last - 1, True), (last, False)]
    for i, (at, after) in enumerate(points):
        c.train(model, CASE, rank, steps=1, first=2 + i)
        new = _state(model)
        status = killer.run(url, model, at=at, after=after)
        assert os.WIFSIGNALED(status), (at, after, status)
        load(url, other, optim=True, show_progress=False)  # must not fail
        got = _state(other)
        committed = at - 1 > manifest_at or (at - 1 == manifest_at and after)
        outcome = "new" if _matches(got, new) else "old" if _matches(got, old) else "torn"
        outcomes.append((at, after, outcome))
        assert outcome == ("new" if committed else "old"), outcomes
        old = got if committed else old
    left = fs.of(url).listdir(url)
    assert os.WEXITSTATUS(killer.run(url, model)) == 0
    return {
        "outcomes": outcomes,
        "writes": writes,
        "replaced": replaced,
        "left": left,
        "after": fs.of(url).listdir(url),
        "committed": files.committed(url, MANIFEST),
    }


def test_round_trip_and_sigkill_at_writes_leaves_old_or_new():
    (r,) = h.run_world(_kill_dumps, 1)
    kinds = {o for _, _, o in r["outcomes"]}
    assert kinds == {"old", "new"}, r["outcomes"]
    assert r["replaced"] == [".dynamicemb-version-00000002"]  # the first one removed
    assert len(r["left"]) > 1  # versions the killed dumps left
    assert len(r["after"]) == 1 and r["committed"].endswith(r["after"][0])


def _dump_to_frozen(rank, world, env):
    import time

    from dynamicemb import DynamicEmbDump
    from dynamicemb.io import fs

    os.environ.update(env)
    # Short limits, so the test is quick: the rule is the same at any value.
    fs.OBJECT_CONNECT_TIMEOUT_S = fs.OBJECT_READ_TIMEOUT_S = 1.0
    fs.OBJECT_ATTEMPTS = 2
    model = c.build(CASE, world)
    c.train(model, CASE, rank, steps=1)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        DynamicEmbDump("s3://frozen/ckpt", model, optim=True)
    return str(e.value), time.monotonic() - start


def test_a_checkpoint_write_to_a_server_that_never_answers_fails_in_bounded_time():
    from tests.object_store.s3_server import FrozenServer

    server = FrozenServer()
    try:
        ((message, seconds),) = h.run_world(_dump_to_frozen, 1, server.env())
    finally:
        server.stop()
    assert message.startswith("s3://frozen/ckpt")
    assert "did not answer in time (connect 1 s, answer 1 s, 2 attempts)" in message
    # Each of the dump's requests gives up after 2 attempts of at most a few
    # seconds: bounded (the run_world timeout would catch a hang).
    assert seconds < 60, seconds
