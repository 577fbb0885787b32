"""A stream folder end to end: a job of two gloo ranks publishes a delta per
step with DeltaPublisher, and a checkpoint (with optimizer state) after
step 3 that prunes deltas 1..3; a DeltaFollower at one rank finds delta 1
gone, loads that checkpoint instead, replays deltas 4..8 by key and ends
holding what the job holds; polling again finds nothing to do."""

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


def _follow(rank, world, folder):
    from dynamicemb.replication import DeltaFollower

    model = c.build(r.replica_case(CASE), world)
    model.eval()
    follower = DeltaFollower(model, folder)
    applied = follower.poll()
    again = follower.poll()
    return {
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
    (follower,) = h.run_world(_follow, 1, folder)
    assert follower["loaded"]
    assert follower["applied"] == list(range(CHECKPOINT_AFTER + 1, STEPS + 1))
    assert follower["again"] == []
    assert follower["sequence"] == STEPS
    r.assert_replica_equals(
        r.merge([follower], 0),
        r.merge(job, STEPS - 1),
        CASE.score_strategy,
        "follower",
    )
