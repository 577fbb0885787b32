"""A sharded model's state_dict() carries its dynamic tables' rows: the flow
every TorchRec job uses, ``dcp.save(model.state_dict())`` then a load into a
model of another world size, round-trips every key's embedding, optimizer
state and scores (saved by two gloo ranks, loaded at one and three), the
state dict at the top level of dcp.load (its entries load themselves) and
nested under "model" (``model.load_state_dict`` loads them).

Collective calls made on one rank only raise naming the call instead of
hanging; ``state_dict_without_rows()`` gives a state dict without the rows and
without a collective."""

import os

import test_reshard as r
import torch
import torch.distributed as dist

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

CASE = r.cases()[0]  # EC: three dist types (row-wise Adagrad state), a static table beside


def _save(rank, world, root):
    import torch.distributed.checkpoint as dcp

    model = c.build(CASE, world)
    c.train(model, CASE, rank)
    state = model.state_dict()
    entries = sorted(k for k in state if k.endswith(".dynamicemb_rows"))
    dcp.save(state, checkpoint_id=os.path.join(root, "flat"))
    dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(root, "nested"))
    return {"contents": c.contents(model), "entries": entries}


def _load(rank, world, root, how):
    import torch.distributed.checkpoint as dcp

    model = c.build(CASE, world)
    if how == "flat":  # the entries at the top level load themselves
        dcp.load(model.state_dict(), checkpoint_id=os.path.join(root, "flat"))
    else:
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(root, "nested"))
        model.load_state_dict(state["model"])
    return c.contents(model)


def test_dcp_of_model_state_dict_round_trips_the_rows_at_any_world_size(tmp_path):
    root = str(tmp_path)
    saved = h.run_world(_save, 2, root)
    dynamic = sorted(t.name for t in CASE.tables if t.dynamic)
    assert saved[0]["entries"] == [
        f"sparse.coll.embeddings.{name}.dynamicemb_rows" for name in dynamic
    ]
    want = c.merge([s["contents"] for s in saved])
    assert all(want[name]["keys"].numel() > 0 for name in dynamic)
    specs = {t.name: t for t in CASE.tables}
    for world, how in ((1, "flat"), (3, "nested")):
        got = c.merge(h.run_world(_load, world, root, how))
        c.assert_same_tables(got, want, what=f"{how}@{world}")
        for name in want:
            assert torch.equal(got[name]["rank"], r._owner(got[name]["keys"], world, specs[name]))
            assert got[name]["step"] == want[name]["step"]


def _alone(rank, world, root):
    import warnings

    from dynamicemb import DynamicEmbDump
    from dynamicemb.checkpoint import state_dict_without_rows

    os.environ["DYNAMICEMB_MEET_TIMEOUT_S"] = "2"
    model = c.build(CASE, world)
    c.train(model, CASE, rank)
    said = {}
    if rank == 0:  # a torch.save habit: the other rank goes on to the barrier below
        for what, call in (
            ("dump", lambda: DynamicEmbDump(os.path.join(root, "ckpt"), model)),
            ("state_dict", model.state_dict),
        ):
            try:
                call()
                said[what] = None
            except RuntimeError as e:
                said[what] = str(e)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with state_dict_without_rows():
                sd = model.state_dict()
                said["without_rows"] = sorted(k for k in sd if "dynamicemb" in k)
                model.load_state_dict(sd)
        said["without_rows_warnings"] = [str(w.message) for w in caught]
    dist.barrier()
    return said


def test_a_collective_call_on_one_rank_raises_naming_it(tmp_path):
    said = h.run_world(_alone, 2, str(tmp_path))[0]
    assert said["dump"] is not None and said["dump"].startswith("DynamicEmbDump is collective")
    assert "only 1 of 2 ranks" in said["dump"] and "DYNAMICEMB_MEET_TIMEOUT_S" in said["dump"]
    assert said["state_dict"] is not None
    collective = "state_dict() of a model with dynamic tables is collective"
    assert said["state_dict"].startswith(collective)
    assert not os.path.exists(os.path.join(str(tmp_path), "ckpt"))
    assert said["without_rows"] == []
    assert not [m for m in said["without_rows_warnings"] if "dynamicemb" in m or "rows" in m]
