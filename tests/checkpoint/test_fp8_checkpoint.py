"""A pooled table of FP8 rows (``embedding_dtype=torch.float8_e4m3fn``) through a
checkpoint: the files say the dtype and hold the rows' bytes (codes, padding,
scale); loaded at the same or another world size the table is bit for bit
the one that was written, trains on as it does (an FP8 row's rounding depends
on its key and the step only), and a float32 table loads the rows' exact
values."""

import json
import os

import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
NAME = "t0"
FP8 = torch.float8_e4m3fn


def _case(dtype=FP8) -> c.Case:
    """A pooled collection of a dynamic FP8 table beside a static one; STEP
    scores, so a model trained on after a load scores as the original."""
    from dynamicemb import DynamicEmbScoreStrategy

    tables = [T(NAME, 64, 8, dist_type="roundrobin"), T("static", 16, 8, dynamic=False)]
    shape = dict(steps=4, key_range=(-20, 200), batch_size=6)
    strategy = DynamicEmbScoreStrategy.STEP
    options = {"embedding_dtype": dtype}
    return c.Case("fp8", "ebc", tables, "rowwise_adagrad", strategy, options=options, **shape)


def _write(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    case = _case()
    model = c.build(case, world)
    c.train(model, case, rank)
    out = {"trained": c.contents(model)}
    DynamicEmbDump(root, model, optim=True)
    fresh = c.build(case, world)
    DynamicEmbLoad(root, fresh, optim=True)
    out["loaded"] = c.contents(fresh)
    for name, m in (("after", model), ("loaded_after", fresh)):
        c.train(m, case, rank, steps=2, first=10)
        out[name] = c.contents(m)
    return out


def _load(rank, world, root):
    from dynamicemb import DynamicEmbLoad

    out = {}
    for name, dtype in (("fp8", FP8), ("float32", torch.float32)):
        m = c.build(_case(dtype), world)
        DynamicEmbLoad(root, m, optim=True)
        out[name] = c.contents(m)
    return out


def test_an_fp8_table_round_trips_a_checkpoint_bit_exact_and_trains_on_alike(tmp_path):
    root = str(tmp_path)
    ranks = h.run_world(_write, 2, root)
    merged = {k: c.merge([r[k] for r in ranks]) for k in ranks[0]}
    trained = merged["trained"][NAME]
    assert trained["keys"].numel() > 0
    c.assert_same_tables(merged["loaded"], merged["trained"], what="loaded")
    c.assert_same_tables(merged["loaded_after"], merged["after"], what="trained on")
    # The meta JSON names the dtype; the values file holds the rows' bytes.
    folder = os.path.join(root, c.COLLECTION)
    with open(os.path.join(folder, f"{NAME}_meta.json")) as f:
        meta = json.load(f)
    assert meta["embedding_dtype"] == "float8_e4m3fn"
    row_bytes = 8 + 4  # dim 8: the codes, then the float32 scale
    values = sum(s["files"]["values"]["bytes"] for s in meta["shards"])
    assert values == trained["keys"].numel() * row_bytes
    # Loaded at one rank: the same FP8 rows, and a float32 table their values.
    (one,) = h.run_world(_load, 1, root)
    c.assert_same_tables(one["fp8"], merged["trained"], what="loaded at world size 1")
    c.assert_same_tables(one["float32"], merged["trained"], what="loaded as float32")
