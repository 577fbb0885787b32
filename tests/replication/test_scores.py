"""get_score and set_score on a sharded model (two gloo ranks).

CUSTOMIZED tables take the scores set_score gives them (one for all, or per
table), and the keys of the next forward passes carry them, read from the
table's raw state; a lower score than before warns unless
DYNAMICEMB_CSTM_SCORE_CHECK=0; a score for a table that is not CUSTOMIZED, an
unknown table or a non-int is refused and sets nothing. get_score gives the
next forward's score: the clock, the next step, the set score.
"""

import os
import warnings

import pytest
import torch
import torch.distributed as dist

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h


def _forward(model, cs, rank, step):
    """One training step without ckpt_harness.train's own set_score;
    returns the keys of every rank's batch, per table."""
    sc = cs.scenario()
    kjt = h.to_kjt(sc, h.batch_for(sc, step, rank)).to(h.worker_device())
    model.train()
    outs = h.local_outputs(sc, model(kjt))
    sum(v.sum() for v in outs.values()).backward()
    world = dist.get_world_size()
    batches = [h.batch_for(sc, step, r_) for r_ in range(world)]
    return {t.name: torch.cat([k for b in batches for k, _ in b[t.feature]]) for t in cs.tables}


def _scores(rank, world):
    from dynamicemb.incremental_dump import get_score, set_score

    cs = r.case("custom", S.CUSTOMIZED, tables=("t0", "t1"), num_embeddings=2048)
    model = c.build(cs, world)
    set_score(model, 7)
    assert get_score(model) == {r.COLL: {"t0": 7, "t1": 7}}
    set_score(model, {"coll": {"t1": 9}})
    assert get_score(model) == {r.COLL: {"t0": 7, "t1": 9}}
    routed = _forward(model, cs, rank, 0)
    got = c.contents(model)
    for name, score in (("t0", 7), ("t1", 9)):
        keys = got[name]["keys"]
        from dynamicemb.shard.routing import route_keys

        mine = routed[name][route_keys(routed[name], world, "hash_roundrobin") == rank]
        assert set(keys.tolist()) == set(mine.tolist())
        assert (got[name]["scores"][:, 0] == score).all()
    with pytest.warns(UserWarning, match="less than the previous"):
        set_score(model, {r.COLL: {"t0": 5}})
    os.environ["DYNAMICEMB_CSTM_SCORE_CHECK"] = "0"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            set_score(model, 3)
    finally:
        del os.environ["DYNAMICEMB_CSTM_SCORE_CHECK"]
    assert get_score(model) == {r.COLL: {"t0": 3, "t1": 3}}
    for bad, match in (
        ({r.COLL: {"t9": 1}}, "no dynamic table 't9'"),
        ({r.COLL: {"t0": 1.5}}, "must be an int"),
        ("7", "must be an int"),
        ({r.COLL: {"t0": 10, "t1": "x"}}, "must be an int"),
    ):
        with pytest.raises(ValueError, match=match):
            set_score(model, bad)
        assert get_score(model) == {r.COLL: {"t0": 3, "t1": 3}}

    ts = r.case("ts", S.TIMESTAMP)
    model = c.build(ts, world)
    with pytest.raises(ValueError, match="not CUSTOMIZED"):
        set_score(model, {r.COLL: {"t0": 1}})
    with pytest.warns(UserWarning, match="no CUSTOMIZED"):
        set_score(model, 1)
    first = get_score(model)[r.COLL]["t0"]
    _forward(model, ts, rank, 0)
    held = c.contents(model)["t0"]["scores"][:, 0]
    second = get_score(model)[r.COLL]["t0"]
    assert first <= int(held.min()) and int(held.max()) <= second

    step = r.case("step", S.STEP)
    model = c.build(step, world)
    assert get_score(model) == {r.COLL: {"t0": 1}}
    _forward(model, step, rank, 0)
    _forward(model, step, rank, 1)
    assert get_score(model) == {r.COLL: {"t0": 3}}
    return True


def test_get_and_set_score_on_a_sharded_model():
    h.run_world(_scores, 2)


def _external_scores(rank, world):
    from dynamicemb.incremental_dump import get_score, incremental_dump
    from tests.storage.py_dict_storage import PyDictStorage

    cs = c.Case(
        "mixed",
        "ec",
        [
            h.TableSpec("t0", 64, 4, options={"external_storage": PyDictStorage}),
            h.TableSpec("t1", 64, 4, options={"score_strategy": S.STEP}),
        ],
        key_range=(0, 50),
    )
    model = c.build(cs, world)
    c.train(model, cs, rank, steps=2)
    threshold = get_score(model)
    # No dynamicemb hash table scores t0's keys: its score is unavailable.
    assert threshold == {r.COLL: {"t0": None, "t1": 3}}
    c.train(model, cs, rank, steps=1, first=2)
    # A dump at get_score's threshold leaves t0 out and dumps t1's step-3 keys.
    (delta,) = incremental_dump(model, threshold).values()
    assert delta.table_names == ["t1"]
    held = c.contents(model)["t1"]
    want = held["keys"][held["scores"][:, 0] >= 3]
    assert sorted(delta.keys[0].tolist()) == sorted(want.tolist()) and want.numel()
    with pytest.raises(NotImplementedError, match="incremental_dump is not supported"):
        incremental_dump(model, 0)
    return True


def test_get_score_of_an_external_storage_table_is_none():
    h.run_world(_external_scores, 1)
