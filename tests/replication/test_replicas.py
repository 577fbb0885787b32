"""Replicas follow a training job delta by delta.

A job of two gloo ranks trains 20 steps on far more distinct keys than its
tables hold (they evict all along), erases keys twice, and publishes an
all-gathered incremental dump after every step (TIMESTAMP, STEP, compound
(TIMESTAMP, LFU) and CUSTOMIZED tables; Adam, row-wise Adagrad, SGD and
Adagrad state). Replicas at one and three ranks (with room for everything,
replaying by key) and at two ranks with the job's own layout (replaying by
slot) read the deltas from their files and, after every delta, hold exactly
the keys the job holds, each on the rank that owns it, with the same
embeddings, optimizer state and (non-timestamp) score words bit for bit:
nothing the job evicted or erased. Eval lookups of the replica read the
job's rows.
"""

import os

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

CASES = [
    r.case("ts_adam", S.TIMESTAMP, "adam", tables=("t0", "t1")),
    r.case("step_rowwise", S.STEP, "rowwise_adagrad", dist_type="roundrobin"),
    r.case("compound_sgd", (S.TIMESTAMP, S.LFU), "sgd"),
    r.case("custom_adagrad", S.CUSTOMIZED, "adagrad"),
]
TRAIN_WORLD = 2


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("stream"))
    trainer = h.run_world(r.train_and_publish, TRAIN_WORLD, CASES, folder, device_type="cpu")
    return folder, trainer


def _check(trainer, replicas, cases, world, mode):
    for cs in cases:
        tr = [t[cs.name] for t in trainer]
        rp = [x[cs.name] for x in replicas]
        assert tr[0]["sequences"] == list(range(1, r.STEPS + 1))
        assert len(rp[0]["contents"]) == r.STEPS
        for step in range(r.STEPS):
            want = r.merge(tr, step)
            got = r.merge(rp, step)
            r.assert_replica_equals(got, want, cs.score_strategy, f"{cs.name} step {step}")
            r.assert_owned(got, world, cs.tables[0].dist_type)
            for stats in (x["stats"][step] for x in rp):
                for s in stats[r.COLL].values():
                    assert s.displaced == 0
        # Eval lookups read the job's final rows (zeros for keys it lacks).
        final = r.merge(tr, r.STEPS - 1)
        for x in rp:
            keys, outs = x["eval"]
            for t in cs.tables:
                rows = dict(zip(final[t.name]["keys"].tolist(), final[t.name]["emb"]))
                want = torch.stack([rows.get(k, torch.zeros(t.dim)) for k in keys.tolist()])
                assert torch.equal(outs[t.feature], want), f"{cs.name} {t.name}: eval rows"


def test_the_job_evicts_and_erases(published):
    folder, trainer = published
    for cs in CASES:
        last = r.merge([t[cs.name] for t in trainer], r.STEPS - 1)
        for name, t in last.items():
            # Two ranks hold at most 256 of the ~600 keys seen.
            assert 0 < t["keys"].numel() <= 2 * 128, (cs.name, name)
        assert sorted(os.listdir(os.path.join(folder, cs.name)))[0] == "delta-000000-000000000001"


@pytest.mark.parametrize("world", [1, 3])
def test_replicas_of_other_world_sizes_follow_by_key(published, world):
    folder, trainer = published
    cases = [r.replica_case(cs) for cs in CASES]
    replicas = h.run_world(r.follow, world, cases, folder, "key")
    _check(trainer, replicas, cases, world, "key")


def test_a_replica_of_the_same_layout_follows_by_slot(published):
    folder, trainer = published
    replicas = h.run_world(r.follow, TRAIN_WORLD, CASES, folder, "slot")
    _check(trainer, replicas, CASES, TRAIN_WORLD, "slot")
    r.assert_same_slots(trainer, replicas, CASES, TRAIN_WORLD)


@pytest.mark.multigpu
def test_replicas_follow_on_gpus(tmp_path):
    """NCCL: the job on two GPUs, replicas on one GPU (by key) and on two (by slot)."""
    folder = str(tmp_path)
    cases = CASES[:2]
    trainer = h.run_world(r.train_and_publish, 2, cases, folder, device_type="cuda")
    one = h.run_world(
        r.follow, 1, [r.replica_case(cs) for cs in cases], folder, "key", device_type="cuda"
    )
    _check(trainer, one, [r.replica_case(cs) for cs in cases], 1, "key")
    two = h.run_world(r.follow, 2, cases, folder, "slot", device_type="cuda")
    _check(trainer, two, cases, 2, "slot")
