"""Rowwise Adagrad's optimizer state in checkpoint files and deltas: one
float32 per row (the scalar its fused row fills of the 16 bytes it
reserves), where checkpoints written before held all four; both load, and a
model loaded from either trains on as the one that wrote it."""

import json
import os
import shutil

import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
NAME = "t0"
RUNTIME_WIDTH = 4  # float32 elements of the 16 bytes a row reserves


def _case() -> c.Case:
    from dynamicemb import DynamicEmbScoreStrategy

    # STEP scores: a model trained on after a load scores its keys as the one
    # that wrote the checkpoint does (timestamps are clock readings).
    return c.Case(
        "rowwise",
        "ec",
        [T(NAME, 64, 8, dist_type="roundrobin"), T("static", 16, 8, dynamic=False)],
        optimizer="rowwise_adagrad",
        score_strategy=DynamicEmbScoreStrategy.STEP,
        steps=4,
        key_range=(-20, 200),
        batch_size=6,
    )


def _folder(path):
    return os.path.join(path, c.COLLECTION)


def _rewrite_as_before(path) -> None:
    """Turns a checkpoint into what dumps wrote before the state narrowed:
    the optimizer state file of every shard four float32 per row (the
    accumulator, then the row's three unused zeros), the meta JSON saying
    so, the manifest listing that meta JSON."""
    from dynamicemb.checkpoint.files import read_manifest
    from dynamicemb.checkpoint.layout import MANIFEST, OPT_VALUES, TableMeta, meta_file
    from dynamicemb.io.files import CheckedWriter, write_manifest, write_small

    folder = _folder(path)
    with open(os.path.join(folder, meta_file(NAME)), "rb") as f:
        meta = TableMeta.decode(f.read(), NAME)
    assert meta.optim_state_dim == 1
    for shard in meta.shards:
        name = os.path.join(folder, shard.files[OPT_VALUES].name)
        one = torch.from_file(name, size=shard.rows, dtype=torch.float32).reshape(-1, 1)
        four = torch.zeros(shard.rows, RUNTIME_WIDTH, dtype=torch.float32)
        four[:, :1] = one
        writer = CheckedWriter(name, meta.checksum_block_bytes)
        writer.write(four.numpy().tobytes())
        shard.files[OPT_VALUES] = writer.close()
    meta.optim_state_dim = RUNTIME_WIDTH
    info = write_small(folder, meta_file(NAME), meta.encode())
    body = read_manifest(path)
    body["collections"][c.COLLECTION][NAME] = info.to_json()
    body.pop("created_unix_ns")
    write_manifest(path, body, MANIFEST)


def _world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.incremental_dump import incremental_dump

    case = _case()
    model = c.build(case, world)
    c.train(model, case, rank)
    out = {"trained": c.contents(model)}
    new, before = os.path.join(root, "new"), os.path.join(root, "before")
    DynamicEmbDump(new, model, optim=True)
    shutil.copytree(new, before)
    _rewrite_as_before(before)
    for name, path in (("new", new), ("before", before)):
        fresh = c.build(case, world)
        DynamicEmbLoad(path, fresh, optim=True)
        out[name] = c.contents(fresh)
        c.train(fresh, case, rank, steps=2, first=10)
        out[f"{name}_after"] = c.contents(fresh)
    c.train(model, case, rank, steps=2, first=10)
    out["after"] = c.contents(model)
    delta = incremental_dump(model, 0)[c.COLLECTION]
    i = delta.table_names.index(NAME)
    out["delta"] = {"keys": delta.keys[i], "state": delta.optimizer_states[i]}
    return out


def test_rowwise_adagrad_state_is_one_scalar_in_files_and_deltas_and_four_still_load(tmp_path):
    root = str(tmp_path)
    (out,) = h.run_world(_world, 1, root)
    trained = out["trained"][NAME]
    assert trained["opt"].shape[1] == RUNTIME_WIDTH
    assert trained["opt"][:, 0].abs().sum() > 0
    assert not trained["opt"][:, 1:].any()  # the row's unused state
    # The file: one float32 per row, the accumulator of each key.
    folder = _folder(os.path.join(root, "new"))
    with open(os.path.join(folder, f"{NAME}_meta.json")) as f:
        meta = json.load(f)
    assert meta["optim_state_dim"] == 1 and meta["optim_state_dtype"] == "float32"
    (shard,) = meta["shards"]
    n = shard["rows"]
    assert n == trained["keys"].numel()
    assert shard["files"]["opt_values"]["bytes"] == n * 4
    keys = torch.from_file(
        os.path.join(folder, shard["files"]["keys"]["file"]), size=n, dtype=torch.int64
    )
    state = torch.from_file(
        os.path.join(folder, shard["files"]["opt_values"]["file"]), size=n, dtype=torch.float32
    )
    order = torch.argsort(keys)
    assert torch.equal(keys[order], trained["keys"])
    assert torch.equal(state[order], trained["opt"][:, 0])
    # Both load whole and train on alike.
    for name in ("new", "before"):
        c.assert_same_tables(out[name], out["trained"], what=f"loaded ({name})")
        c.assert_same_tables(out[f"{name}_after"], out["after"], what=f"trained on ({name})")
    # A delta carries the same width.
    after = out["after"][NAME]
    delta = out["delta"]
    assert delta["state"].shape == (delta["keys"].numel(), 1)
    order = torch.argsort(delta["keys"])
    idx = torch.searchsorted(after["keys"], delta["keys"][order])
    assert torch.equal(after["keys"][idx], delta["keys"][order])
    assert torch.equal(delta["state"][order, 0], after["opt"][idx, 0])
