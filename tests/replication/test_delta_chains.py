"""Per-rank deltas and each replica rank's own chain, over two gloo ranks.

Every rank of a job dumps its own delta (``pg=None``: ``meta["rank"]`` is
the producing rank) and hands it to every rank of a replica of the same
layout. Another rank's delta applies (all its keys skipped) without
advancing this rank's chain; ``check_follows`` refuses it, a duplicate, a
gap and a delta of another run, and lets this rank's deltas through in
order; the replica ends equal to the job rank by rank.
"""

import pytest
import torch
import torch.distributed as dist

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

CASE = r.case("chains", S.TIMESTAMP)


def _per_rank_deltas(model, rank, world, steps, first=0):
    from dynamicemb.incremental_dump import get_score, incremental_dump

    threshold = get_score(model)
    out = []
    for step in range(first, first + steps):
        c.train(model, CASE, rank, steps=1, first=step)
        mine = incremental_dump(model, threshold)
        threshold = {r.COLL: {"t0": mine[r.COLL].meta[0]["current_score"]}}
        every = [None] * world
        dist.all_gather_object(every, mine)
        out.append(every)
    return out


def _chains(rank, world):
    from dynamicemb.incremental_dump import replay_increment
    from dynamicemb.replication import DeltaError, check_follows

    source, replica = c.build(CASE, world), c.build(CASE, world)
    deltas = _per_rank_deltas(source, rank, world, 3)
    rows = c.kernels(replica)[0].emb_module.rows
    other = 1 - rank
    out = {"meta": [(d[r.COLL].meta[0]["rank"], d[r.COLL].meta[0]["sequence"]) for d in deltas[0]]}

    def refused(delta, match):
        with pytest.raises(DeltaError, match=match):
            check_follows(replica, delta)

    refused(deltas[0][other], f"rank {other}'s, this is rank {rank}")
    stats = replay_increment(replica, deltas[0][other])[r.COLL]["t0"]
    out["other"] = (stats.upserted, stats.skipped, deltas[0][other][r.COLL].keys[0].numel())
    out["after_other"] = list(rows.delta_sequence)
    check_follows(replica, deltas[0][rank])
    replay_increment(replica, deltas[0][rank])
    out["after_own"] = list(rows.delta_sequence)
    refused(deltas[0][rank], "duplicate")
    refused(deltas[2][rank], "missing")
    for step in (1, 2):
        check_follows(replica, deltas[step][rank])
        replay_increment(replica, deltas[step][rank])
    r.assert_replica_equals(c.contents(replica), c.contents(source), S.TIMESTAMP, "replica")
    # Another model of the same configuration: its delta 4 is foreign.
    stranger = c.build(CASE, world)
    strange = _per_rank_deltas(stranger, rank, world, 4, first=50)[3][rank]
    refused(strange, "foreign")
    out["end"] = list(rows.delta_sequence)
    return out


def test_another_ranks_delta_does_not_advance_this_ranks_chain():
    for out in h.run_world(_chains, 2):
        assert out["meta"] == [(0, 1), (1, 1)]
        upserted, skipped, n = out["other"]
        assert n > 0 and (upserted, skipped) == (0, n)
        assert out["after_other"] == [0]
        assert out["after_own"] == [1]
        assert out["end"] == [3]


def _group_after_local(rank, world):
    from dynamicemb.incremental_dump import get_score, incremental_dump
    from dynamicemb.replication import erase_keys

    model = c.build(CASE, world)
    rows = c.kernels(model)[0].emb_module.rows
    threshold = get_score(model)
    c.train(model, CASE, rank, steps=2)
    held = c.contents(model)["t0"]["keys"]
    # Keys of this rank, erased and recorded; then a monitor on rank 0 dumps
    # its own delta (pg=None), which drains rank 0's record.
    first = held[:3]
    erase_keys(model, {r.COLL: {"t0": first}})
    if rank == 0:
        local = incremental_dump(model, threshold)
        assert local[r.COLL].meta[0]["sequence"] == 1
        assert sorted(local[r.COLL].erased_keys[0].tolist()) == sorted(first.tolist())
    second = held[3:5]
    erase_keys(model, {r.COLL: {"t0": second}})
    # What the group's delta must remove: every rank's second erase, and
    # rank 1's first (no dump of its own drained it).
    every = [None] * world
    dist.all_gather_object(every, second if rank == 0 else torch.cat([first, second]))
    # A group dump refused on one rank (an unknown table): the same error on
    # every rank, and nothing drained.
    bad = {r.COLL: {"t0": threshold[r.COLL]["t0"]}}
    if rank == 1:
        bad = {r.COLL: {"nope": 0}}
    with pytest.raises(ValueError) as refused:
        incremental_dump(model, bad, dist.group.WORLD)
    group = incremental_dump(model, threshold, dist.group.WORLD)[r.COLL]
    return {
        "refused": str(refused.value),
        "sequence": group.meta[0]["sequence"],
        "recorded": list(rows.delta_sequence),
        "erased": sorted(group.erased_keys[0].tolist()),
        "want_erased": sorted(torch.cat(every).tolist()),
        "first": sorted(first.tolist()),
    }


def test_a_group_dump_after_a_ranks_own_agrees_on_the_sequence():
    outs = h.run_world(_group_after_local, 2)
    assert outs[0]["refused"] == outs[1]["refused"]
    assert "rank 1" in outs[0]["refused"] and "'nope'" in outs[0]["refused"]
    for out in outs:
        # Rank 0's own dump advanced it to 1: the group's delta is 2 on both.
        assert out["sequence"] == 2 and out["recorded"] == [2]
        # Drained by no refused dump; rank 0's first erase went out with its
        # own delta.
        assert out["erased"] == out["want_erased"]
        assert not set(outs[0]["first"]) & set(out["erased"])
