"""A delta stream in an s3:// folder: a job of two gloo ranks publishes a
delta per step and, after step 2, a checkpoint that prunes deltas 1..2 (a
DynamicEmbDump of two ranks into the bucket); a DeltaFollower of one rank
finds delta 1 gone, loads that checkpoint (resharded to one rank), replays
the rest by key and ends holding what the job holds."""

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

CASE = r.case("stream_s3", (S.TIMESTAMP, S.LFU), "adam", tables=("t0", "t1"))
STEPS, CHECKPOINT_AFTER = 5, 2


def _publish(rank, world, folder):
    from dynamicemb.replication import DeltaPublisher
    from dynamicemb.replication.stream import list_deltas

    model = c.build(CASE, world)
    pub = DeltaPublisher(model, folder)
    listed = []
    for step in range(STEPS):
        c.train(model, CASE, rank, steps=1, first=step)
        assert pub.publish() == step + 1
        if step + 1 == CHECKPOINT_AFTER:
            pub.checkpoint(optim=True)
        listed.append(list_deltas(folder))
    return {"contents": [c.contents(model)], "listed": listed}


def _follow(rank, world, folder):
    from dynamicemb.replication import DeltaFollower

    model = c.build(r.replica_case(CASE), world)
    model.eval()
    follower = DeltaFollower(model, folder)
    applied = follower.poll()
    return {
        "applied": applied,
        "again": follower.poll(),
        "loaded": follower.loaded_checkpoint,
        "contents": [c.contents(model)],
    }


def test_a_follower_replays_a_stream_in_a_bucket(s3):
    from dynamicemb.io import fs

    folder = s3.bucket() + "/streams/ctr"
    job = h.run_world(_publish, 2, folder)
    assert job[0]["listed"][CHECKPOINT_AFTER - 1] == []  # pruned by the checkpoint
    assert job[0]["listed"][-1] == list(range(CHECKPOINT_AFTER + 1, STEPS + 1))
    names = fs.of(folder).listdir(folder)
    assert names == ["checkpoint"] + [f"delta-000000-{s:012d}" for s in range(3, STEPS + 1)]
    (follower,) = h.run_world(_follow, 1, folder)
    assert follower["loaded"]
    assert follower["applied"] == list(range(CHECKPOINT_AFTER + 1, STEPS + 1))
    assert follower["again"] == []
    r.assert_replica_equals(
        r.merge([follower], 0), r.merge(job, 0), CASE.score_strategy, "follower"
    )
