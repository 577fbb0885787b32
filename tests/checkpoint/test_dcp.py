"""torch.distributed.checkpoint with DynamicEmbStateful: the dynamic tables
saved in one dcp.save call together with a dense tensor, by two gloo ranks,
and loaded in one dcp.load call at one and three ranks."""

import os

import test_reshard as r
import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

CASES = [r.cases()[0]]  # EC: three dist types, a static table beside


def _save(rank, world, root):
    import torch.distributed.checkpoint as dcp

    from dynamicemb.checkpoint import DynamicEmbStateful

    out = {}
    for case in CASES:
        model = c.build(case, world)
        c.train(model, case, rank)
        dense = {"w": torch.arange(6.0) + 1}
        dcp.save(
            {"dense": dense, "dynamicemb": DynamicEmbStateful(model)},
            checkpoint_id=os.path.join(root, case.name),
        )
        out[case.name] = c.contents(model)
    return out


def _load(rank, world, root):
    import torch.distributed.checkpoint as dcp

    from dynamicemb.checkpoint import DynamicEmbStateful

    out = {}
    for case in CASES:
        model = c.build(case, world)
        dense = {"w": torch.zeros(6)}
        dcp.load(
            {"dense": dense, "dynamicemb": DynamicEmbStateful(model)},
            checkpoint_id=os.path.join(root, case.name),
        )
        out[case.name] = {"contents": c.contents(model), "dense": dense["w"]}
    return out


def test_dcp_save_at_two_load_at_one_and_three(tmp_path):
    root = str(tmp_path)
    saved = h.run_world(_save, 2, root)
    for world in (1, 3):
        loaded = h.run_world(_load, world, root)
        for case in CASES:
            want = c.merge([s[case.name] for s in saved])
            got = c.merge([x[case.name]["contents"] for x in loaded])
            c.assert_same_tables(got, want, what=f"{case.name}@{world}")
            specs = {t.name: t for t in case.tables}
            for name in want:
                owner = r._owner(got[name]["keys"], world, specs[name])
                assert torch.equal(got[name]["rank"], owner), (case.name, name, world)
                assert got[name]["step"] == want[name]["step"]
            for x in loaded:
                assert torch.equal(x[case.name]["dense"], torch.arange(6.0) + 1)
