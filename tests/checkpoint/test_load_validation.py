"""Loads refused for what the checksums cannot catch, changing nothing.

One gloo process dumps a trained model (Adam, two tables) and loads into
another trained one. An Adam checkpoint with ``optim=True`` into an SGD model,
and an SGD one into an Adam model, are refused (``optim=False`` loads their
embeddings). Checkpoints edited by hand with every checksum recomputed (the
files', the meta JSON's in the manifest, the manifest's own) are refused with
an error naming the bad value: a repeated key, a file name leading out of the
folder (``../``), a step or delta sequence out of range, a shard rank out of
range. After each refusal the target's tables (keys, embeddings, optimizer
state, scores), its step and its delta sequences are as they were.
"""

import json
import os
import shutil
import zlib

import numpy as np
import pytest
import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
TABLES = [T("t0", 40, 4, dist_type="roundrobin"), T("t1", 40, 4, dist_type="continuous")]
ADAM = c.Case("adam", "ec", TABLES, optimizer="adam")
SGD = c.Case("sgd", "ec", TABLES, optimizer="sgd")


def edited(good: str, path: str, table: str, edit_meta=None, edit_keys=None) -> str:
    """A copy of checkpoint ``good`` whose ``table`` meta JSON (``edit_meta``)
    or first keys file (``edit_keys``, on its int64 array) is edited, with
    every checksum recomputed as a dump would write it."""
    shutil.copytree(good, path)
    folder = os.path.join(path, c.COLLECTION)
    meta_name = os.path.join(folder, f"{table}_meta.json")
    meta = json.load(open(meta_name))
    if edit_keys is not None:
        shard = next(s for s in meta["shards"] if s["rows"])
        entry = shard["files"]["keys"]
        full = os.path.join(folder, entry["file"])
        keys = np.fromfile(full, dtype=np.int64)
        data = edit_keys(keys).astype(np.int64).tobytes()
        open(full, "wb").write(data)
        block = meta["checksum_block_bytes"]
        entry["crc32"] = [zlib.crc32(data[i : i + block]) for i in range(0, len(data), block)]
    if edit_meta is not None:
        edit_meta(meta)
    c.write_meta(path, table, meta)
    return path


def _state(model) -> dict:
    tables = c.contents(model)
    sequences = [list(k.emb_module.rows.delta_sequence) for k in c.kernels(model)]
    return {"tables": tables, "sequences": sequences}


def _assert_state(got: dict, want: dict, what: str) -> None:
    c.assert_same_tables(got["tables"], want["tables"], what=what)
    for name in want["tables"]:
        assert int(got["tables"][name]["step"]) == int(want["tables"][name]["step"]), what
    assert got["sequences"] == want["sequences"], what


def _checks_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.checkpoint import CheckpointError

    adam = c.build(ADAM, world)
    c.train(adam, ADAM, rank)
    good = os.path.join(root, "adam")
    DynamicEmbDump(good, adam, optim=True)
    sgd = c.build(SGD, world)
    c.train(sgd, SGD, rank)
    good_sgd = os.path.join(root, "sgd")
    DynamicEmbDump(good_sgd, sgd, optim=True)
    want = c.contents(adam)
    target = c.build(ADAM, world)
    c.train(target, ADAM, rank, first=50)
    check = c.Checks()

    def refused(model, path, exc, match, optim=True):
        before = _state(model)
        try:
            DynamicEmbLoad(path, model, optim=optim)
        except exc as e:
            for m in [match] if isinstance(match, str) else match:
                assert m in str(e), f"message {e!r} lacks {m!r}"
        else:
            raise AssertionError("the load did not fail")
        _assert_state(_state(model), before, f"after the refused load of {path}")

    @check("adam_state_into_sgd")
    def _():
        other = c.build(SGD, world)
        c.train(other, SGD, rank, first=30)
        refused(
            other,
            good,
            ValueError,
            ["table 't0'", "optim=True", "ADAM's (optim_state_dim 8)", "EXACT_SGD (0)"],
        )
        DynamicEmbLoad(good, other, optim=False)  # the embeddings alone
        got = c.contents(other)
        for t in want:
            assert torch.equal(got[t]["keys"], want[t]["keys"])
            assert torch.equal(got[t]["emb"], want[t]["emb"])

    @check("sgd_state_into_adam")
    def _():
        refused(
            target,
            good_sgd,
            ValueError,
            ["table 't0'", "optim=True", "EXACT_SGD's (optim_state_dim 0)", "ADAM (8)"],
        )

    @check("repeated_key")
    def _():
        def repeat(keys):
            keys[-1] = keys[0]
            return keys

        p = edited(good, os.path.join(root, "repeat"), "t1", edit_keys=repeat)
        key = int(np.fromfile(_first_keys(p, "t1"), dtype=np.int64)[0])
        refused(target, p, CheckpointError, f"key {key} appears 2 times in the checkpoint")

    @check("reserved_key")
    def _():
        def reserve(keys):
            keys[0] = -(2**63)
            return keys

        p = edited(good, os.path.join(root, "reserved"), "t0", edit_keys=reserve)
        refused(target, p, CheckpointError, f"key {-(2**63)} at index 0 is reserved")

    @check("file_outside_the_folder")
    def _():
        def escape(meta):
            entry = meta["shards"][0]["files"]["values"]
            entry["file"] = "../" + entry["file"]

        p = edited(good, os.path.join(root, "escape"), "t0", edit_meta=escape)
        # The file is there too, so only the name can refuse it.
        name = json.load(open(os.path.join(good, c.COLLECTION, "t0_meta.json")))
        name = name["shards"][0]["files"]["values"]["file"]
        shutil.copy(os.path.join(p, c.COLLECTION, name), os.path.join(p, name))
        refused(target, p, CheckpointError, ["the values file", f"'../{name}'", "cannot name"])

    for field, value in (
        ("step", -1),
        ("step", 2**63),
        ("delta_sequence", -3),
        ("delta_sequence", 2**64),
    ):

        @check(f"{field}_{value}")
        def _(field=field, value=value):
            def set_value(meta):
                meta[field] = value

            p = edited(good, os.path.join(root, f"{field}{value}"), "t1", edit_meta=set_value)
            refused(target, p, CheckpointError, f"checkpoint's {field} {value} is out of range")

    @check("shard_rank_out_of_range")
    def _():
        def bad_rank(meta):
            meta["shards"][0]["rank"] = 5

        p = edited(good, os.path.join(root, "rank"), "t0", edit_meta=bad_rank)
        refused(target, p, CheckpointError, "shard of rank 5 (world_size 1)")

    @check("good_checkpoint_loads")
    def _():
        DynamicEmbLoad(good, target, optim=True)
        c.assert_same_tables(c.contents(target), want)

    return check.results


def _first_keys(path: str, table: str) -> str:
    meta = json.load(open(os.path.join(path, c.COLLECTION, f"{table}_meta.json")))
    shard = next(s for s in meta["shards"] if s["rows"])
    return os.path.join(path, c.COLLECTION, shard["files"]["keys"]["file"])


CHECKS = [
    "adam_state_into_sgd",
    "sgd_state_into_adam",
    "repeated_key",
    "reserved_key",
    "file_outside_the_folder",
    "step_-1",
    f"step_{2**63}",
    "delta_sequence_-3",
    f"delta_sequence_{2**64}",
    "shard_rank_out_of_range",
    "good_checkpoint_loads",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return c.run_checks(_checks_world, str(tmp_path_factory.mktemp("validation")), CHECKS)


@pytest.mark.parametrize("name", CHECKS)
def test_check(results, name):
    assert results[name] == "ok", results[name]
