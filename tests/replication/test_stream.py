"""A stream folder end to end: a job of two gloo ranks publishes a delta per
step with DeltaPublisher, and a checkpoint (with optimizer state) after
step 3 that prunes deltas 1..3; a DeltaFollower at one rank finds delta 1
gone, loads that checkpoint instead, replays deltas 4..8 by key and ends
holding what the job holds; polling again finds nothing to do. A follower
whose replay of delta 6 is interrupted after one of its two tables (the
tables left at deltas 6 and 5) loads the checkpoint again at the next poll
and ends the same."""

import os

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

CASE = r.case("stream", (S.TIMESTAMP, S.LFU), "adam", tables=("t0", "t1"))
STEPS, CHECKPOINT_AFTER = 8, 3


def _publish(rank, world, folder):
    from dynamicemb.replication import DeltaPublisher
    from dynamicemb.replication.stream import list_deltas

    model = c.build(CASE, world)
    pub = DeltaPublisher(model, folder)
    snaps, listed = [], []
    for step in range(STEPS):
        c.train(model, CASE, rank, steps=1, first=step)
        assert pub.publish() == step + 1
        if step + 1 == CHECKPOINT_AFTER:
            pub.checkpoint(optim=True)
        snaps.append(c.contents(model))
        listed.append(list_deltas(folder))
    return {"contents": snaps, "listed": listed}


def _follow(rank, world, folder, interrupt=False):
    import pytest

    from dynamicemb.replication import DeltaFollower
    from dynamicemb.storage.table_rows import TableRows

    model = c.build(r.replica_case(CASE), world)
    model.eval()
    follower = DeltaFollower(model, folder)
    out = {}
    if interrupt:
        # The replay of delta 6 fails after its first table (t0) was written:
        # t0 at delta 6, t1 at delta 5. The next poll loads the checkpoint.
        with c.failing_call(TableRows, "upsert_rows", 6, "interrupted"):
            with pytest.raises(RuntimeError, match="interrupted"):
                follower.poll()
        rows = c.kernels(model)[0].emb_module.rows
        out["mixed"] = list(rows.delta_sequence)
    applied = follower.poll()
    again = follower.poll()
    return out | {
        "applied": applied,
        "again": again,
        "loaded": follower.loaded_checkpoint,
        "sequence": follower.sequence,
        "contents": [c.contents(model)],
    }


def test_a_follower_loads_the_checkpoint_and_replays_the_rest(tmp_path):
    folder = str(tmp_path)
    job = h.run_world(_publish, 2, folder)
    # Deltas up to the checkpoint's were pruned when it was published.
    assert job[0]["listed"][CHECKPOINT_AFTER - 1] == []
    assert job[0]["listed"][-1] == list(range(CHECKPOINT_AFTER + 1, STEPS + 1))
    assert os.path.isdir(os.path.join(folder, "checkpoint"))
    for interrupt in (False, True):
        (follower,) = h.run_world(_follow, 1, folder, interrupt)
        if interrupt:
            assert follower["mixed"] == [6, 5]
        assert follower["loaded"]
        assert follower["applied"] == list(range(CHECKPOINT_AFTER + 1, STEPS + 1))
        assert follower["again"] == []
        assert follower["sequence"] == STEPS
        r.assert_replica_equals(
            r.merge([follower], 0),
            r.merge(job, STEPS - 1),
            CASE.score_strategy,
            f"follower (a replay interrupted: {interrupt})",
        )
