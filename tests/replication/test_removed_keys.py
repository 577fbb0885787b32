"""Evicted and erased keys, per EvictedItemMode.

RETAIN_KEY tables hand out every key they evicted exactly once (compared with
the keys that left the table between steps, read from its raw state);
DISCARD tables are left out of pop_evicted_keys and their deltas carry None.
An erase with RETAIN_KEY is recorded for pop_erased_keys and the next delta,
one with DISCARD only removes. incremental_dump drains both records; with a
process group, pops return the union over its ranks.
"""

import pytest
import torch
import torch.distributed as dist

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb import EvictedItemMode
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _held(model, name) -> set[int]:
    return set(c.contents(model)[name]["keys"].tolist())


def _train_tracking(model, cs, rank, steps, first=0):
    """Trains; returns per table the keys that left it (evictions: no erase
    happens meanwhile), and the keys that may also have been evicted: a
    batch's new key can evict a key that comes later in the same batch,
    which is then inserted again (the table applies a batch one key at a
    time), so it is back by the end of the step."""
    from dynamicemb.shard.routing import route_keys

    gone = {t: set() for t in cs.dynamic}
    maybe = {t: set() for t in cs.dynamic}
    world = dist.get_world_size()
    for step in range(first, first + steps):
        before = {t: _held(model, t) for t in cs.dynamic}
        c.train(model, cs, rank, steps=1, first=step)
        for t in cs.tables:
            after = _held(model, t.name)
            gone[t.name] |= before[t.name] - after
            batch = torch.cat(
                [
                    k
                    for r_ in range(world)
                    for k, _ in h.batch_for(cs.scenario(), step, r_)[t.feature]
                ]
            )
            mine = batch[route_keys(batch, world, t.dist_type) == rank]
            maybe[t.name] |= set(mine.tolist()) & before[t.name] & after
    return gone, maybe


def _assert_evicted(got: torch.Tensor, gone: set[int], maybe: set[int]) -> None:
    got = set(got.tolist())
    assert gone <= got, sorted(gone - got)[:10]
    assert got <= gone | maybe, sorted(got - gone - maybe)[:10]


def _modes(rank, world):
    from dynamicemb.incremental_dump import get_score, incremental_dump
    from dynamicemb.replication import erase_keys, pop_erased_keys, pop_evicted_keys

    group = dist.group.WORLD
    retain = r.case("retain", S.TIMESTAMP, tables=("t0", "t1"))
    model = c.build(retain, world)
    gone, maybe = _train_tracking(model, retain, rank, 10)
    assert all(gone[t] for t in retain.dynamic), "the case must evict"
    # Only t0 popped: t1 keeps its record.
    popped = pop_evicted_keys(model, {r.COLL: ["t0"]})
    assert sorted(popped[r.COLL]) == ["t0"]
    keys = popped[r.COLL]["t0"]
    assert torch.equal(keys, torch.unique(keys))  # each key once
    _assert_evicted(keys, gone["t0"], maybe["t0"])
    popped = pop_evicted_keys(model)
    assert popped[r.COLL]["t0"].numel() == 0
    _assert_evicted(popped[r.COLL]["t1"], gone["t1"], maybe["t1"])
    # With the group: the union of every rank's keys.
    gone, maybe = _train_tracking(model, retain, rank, 4, first=10)
    everyone = [None] * world
    dist.all_gather_object(everyone, (gone["t0"], maybe["t0"]))
    union = pop_evicted_keys(model, {r.COLL: ["t0"]}, pg=group)[r.COLL]["t0"]
    _assert_evicted(
        union, set().union(*(g for g, _ in everyone)), set().union(*(m for _, m in everyone))
    )
    pop_evicted_keys(model)

    # Erases: recorded with RETAIN_KEY (the default), not with DISCARD.
    held = sorted(_held(model, "t0"))
    asked = torch.tensor(held[:5] + [10_001, 10_002])
    assert erase_keys(model, {r.COLL: {"t0": asked}}) == {r.COLL: {"t0": 5}}
    quiet = torch.tensor(held[5:8])
    erase_keys(model, {r.COLL: {"t0": quiet}}, EvictedItemMode.DISCARD)
    assert not set(held[:8]) & _held(model, "t0")
    erased = pop_erased_keys(model)
    assert erased[r.COLL]["t0"].tolist() == held[:5]
    assert erased[r.COLL]["t1"].numel() == 0  # every table is there
    assert pop_erased_keys(model)[r.COLL]["t0"].numel() == 0
    with pytest.raises(ValueError, match="int64"):
        erase_keys(model, {r.COLL: {"t0": torch.tensor([1.0])}})
    with pytest.raises(ValueError, match="no dynamic table"):
        erase_keys(model, {r.COLL: {"t9": asked}})

    # A dump drains both; its removed keys are those not back in the table.
    threshold = get_score(model)
    gone, maybe = _train_tracking(model, retain, rank, 4, first=14)
    erase_keys(model, {r.COLL: {"t0": torch.tensor(sorted(_held(model, "t0"))[:3])}})
    delta = incremental_dump(model, threshold)[r.COLL]
    held_now = _held(model, "t0")
    i = delta.table_names.index("t0")
    assert set(delta.evicted_keys[i].tolist()) == gone["t0"] - held_now
    assert len(delta.erased_keys[i]) == 3 and not set(delta.erased_keys[i].tolist()) & held_now
    assert pop_evicted_keys(model)[r.COLL]["t0"].numel() == 0
    assert pop_erased_keys(model)[r.COLL]["t0"].numel() == 0

    # DISCARD: nothing retained, the table is left out, deltas carry None.
    discard = r.case("discard", S.TIMESTAMP, retain=False)
    model = c.build(discard, world)
    threshold = get_score(model)
    assert _train_tracking(model, discard, rank, 10)[0]["t0"]
    assert pop_evicted_keys(model) == {}
    delta = incremental_dump(model, threshold)[r.COLL]
    assert delta.evicted_keys == [None]
    assert delta.erased_keys[0].numel() == 0
    return True


def test_evicted_item_modes():
    h.run_world(_modes, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_evicted_item_modes_one_rank(device):
    h.run_world(_modes, 1, device_type=device)
