"""Loads that must fail and change nothing, and checkpoints of other kinds
that must load: fp16 / bf16 values, the legacy layout, a table selection.

One gloo process (world size 1) runs every check; a failing load must raise
the expected error and leave the model's tables exactly as they were. The
fp16 / bf16 and legacy checkpoints are written here from the documented
format (numpy bytes, JSON, zlib's CRC-32), not by the dump code.
"""

import json
import os
import shutil
import warnings
import zlib

import numpy as np
import pytest
import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
CASE = c.Case(
    "bad",
    "ec",
    [T("t0", 40, 4, dist_type="roundrobin"), T("t1", 40, 4, dist_type="continuous")],
    optimizer="adam",
)


def _copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def _files(path: str, table: str, kind: str) -> list[str]:
    folder = os.path.join(path, c.COLLECTION)
    return sorted(
        os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(f"{table}_{kind}.")
    )


def _flip(name: str, at: int) -> None:
    with open(name, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


def _truncate(name: str, drop: int) -> None:
    size = os.path.getsize(name)
    with open(name, "r+b") as f:
        f.truncate(size - drop)


def _rewrite_dtype(path: str, dtype: torch.dtype, name: str) -> None:
    """Rewrites every value and optimizer-state file at ``dtype`` and fixes
    the meta JSONs and the manifest (sizes, CRC-32s)."""
    folder = os.path.join(path, c.COLLECTION)

    def edit(meta: dict) -> None:
        meta["embedding_dtype"] = meta["optim_state_dtype"] = name
        for shard in meta["shards"]:
            for kind in ("values", "opt_values"):
                entry = shard["files"][kind]
                full = os.path.join(folder, entry["file"])
                rows = np.fromfile(full, dtype=np.float32)
                data = torch.from_numpy(rows).to(dtype).view(torch.int16).numpy().tobytes()
                with open(full, "wb") as f:
                    f.write(data)
                entry["bytes"] = len(data)
                entry["crc32"] = [zlib.crc32(data)] if data else []

    manifest = json.load(open(os.path.join(path, "dynamicemb_checkpoint.json")))
    for table in manifest["collections"][c.COLLECTION]:
        _edit_meta(path, table, edit)


def _edit_meta(path: str, table: str, edit) -> None:
    """Edits a table's meta JSON and records its new size and CRC-32 in the
    manifest (so that only the edit is wrong)."""
    meta = json.load(open(os.path.join(path, c.COLLECTION, f"{table}_meta.json")))
    edit(meta)
    c.write_meta(path, table, meta)


def _write_legacy(path: str, tables, with_state: bool) -> None:
    """The legacy layout: <table>_keys (int64), <table>_values (float32,
    embedding [and optimizer state] per row), <table>_scores (uint64)."""
    folder = os.path.join(path, c.COLLECTION)
    os.makedirs(folder)
    for name, t in tables.items():
        rows = torch.cat([t["emb"], t["opt"]], dim=1) if with_state else t["emb"]
        t["keys"].numpy().tofile(os.path.join(folder, f"{name}_keys"))
        rows.numpy().astype(np.float32).tofile(os.path.join(folder, f"{name}_values"))
        t["scores"][:, 0].numpy().astype(np.uint64).tofile(os.path.join(folder, f"{name}_scores"))


def _checks_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.checkpoint import CheckpointError, load

    model = c.build(CASE, world)
    c.train(model, CASE, rank)
    good = os.path.join(root, "good")
    DynamicEmbDump(good, model, optim=True)
    want = c.contents(model)
    target = c.build(CASE, world)
    c.train(target, CASE, rank, first=50)  # other contents than the checkpoint's
    before = c.contents(target)

    check = c.Checks()

    def refused(path, exc, match, **kw):
        try:
            load(path, target, optim=kw.pop("optim", True), show_progress=False, **kw)
        except exc as e:
            assert match in str(e), f"message {e!r} lacks {match!r}"
        else:
            raise AssertionError("the load did not fail")
        c.assert_same_tables(c.contents(target), before, what="after the failed load")

    @check("corrupted_values")
    def _():
        p = _copy(good, os.path.join(root, "flip"))
        _flip(_files(p, "t0", "values")[0], 5)
        refused(p, CheckpointError, "is corrupted: checksum mismatch in block 0")

    @check("corrupted_keys_of_the_last_table")
    def _():
        p = _copy(good, os.path.join(root, "flip_keys"))
        _flip(_files(p, "t1", "keys")[-1], 3)
        refused(p, CheckpointError, "is corrupted")

    @check("truncated_values")
    def _():
        p = _copy(good, os.path.join(root, "trunc"))
        _truncate(_files(p, "t1", "opt_values")[0], 4)
        refused(p, CheckpointError, "(truncated)")

    @check("missing_file")
    def _():
        p = _copy(good, os.path.join(root, "missing"))
        os.remove(_files(p, "t0", "scores")[0])
        refused(p, CheckpointError, "does not exist")

    @check("corrupted_meta")
    def _():
        p = _copy(good, os.path.join(root, "meta"))
        _flip(os.path.join(p, c.COLLECTION, "t1_meta.json"), 40)
        refused(p, CheckpointError, "t1_meta.json is corrupted or truncated")

    @check("corrupted_manifest")
    def _():
        p = _copy(good, os.path.join(root, "manifest"))
        name = os.path.join(p, "dynamicemb_checkpoint.json")
        text = open(name).read().replace('"optim": true', '"optim": false')
        open(name, "w").write(text)
        refused(p, CheckpointError, "manifest checksum mismatch")

    @check("missing_folder")
    def _():
        refused(os.path.join(root, "nothing_here"), CheckpointError, "no dynamicemb checkpoint")

    @check("meta_without_the_dtype_keys")
    def _():
        # A meta JSON without embedding_dtype (written before the key existed,
        # its CRC-32 right): refused naming the key, not read as float32
        # (docs/architecture.md, "Departures").
        p = _copy(good, os.path.join(root, "no_dtype"))
        _edit_meta(p, "t0", lambda meta: meta.pop("embedding_dtype"))
        refused(p, CheckpointError, "embedding_dtype")

    @check("optimizer_state_stays_float32_in_a_bfloat16_table")
    def _():
        # The departure: a 16-bit table's optimizer state is stored at float32.
        bf16 = c.Case(
            "bf16",
            "ec",
            [T("t0", 40, 4, options={"embedding_dtype": torch.bfloat16})],
            optimizer="adam",
        )
        m = c.build(bf16, world)
        c.train(m, bf16, rank)
        p = os.path.join(root, "bf16")
        DynamicEmbDump(p, m, optim=True)
        meta = json.load(open(os.path.join(p, c.COLLECTION, "t0_meta.json")))
        assert (meta["embedding_dtype"], meta["optim_state_dtype"]) == ("bfloat16", "float32")

    @check("missing_table")
    def _():
        p = os.path.join(root, "only_t0")
        DynamicEmbDump(p, model, table_names={"coll": ["t0"]}, optim=True)
        refused(p, CheckpointError, "has no table 't1'")

    @check("no_optimizer_state")
    def _():
        p = os.path.join(root, "no_optim")
        DynamicEmbDump(p, model)
        refused(p, ValueError, "holds no optimizer state")

    @check("dim_mismatch")
    def _():
        wide = c.Case(CASE.name, "ec", [T("t0", 40, 8), T("t1", 40, 8)], optimizer="adam")
        other = c.build(wide, world)
        c.train(other, wide, rank)
        prior = c.contents(other)
        try:
            DynamicEmbLoad(good, other, optim=True)
        except ValueError as e:
            assert "table 't0'" in str(e) and "embedding_dim 4" in str(e) and "dim 8" in str(e), e
        else:
            raise AssertionError("a dim mismatch loaded")
        c.assert_same_tables(c.contents(other), prior)

    @check("failure_while_applying_restores")
    def _():
        from dynamicemb.storage.table_rows import TableRows as M

        with c.failing_call(M, "import_rows", 2, "injected failure") as calls:
            refused(good, RuntimeError, "injected failure")
        assert len(calls) == 2

    @check("dump_refuses_a_foreign_folder")
    def _():
        p = os.path.join(root, "foreign")
        os.makedirs(p)
        open(os.path.join(p, "notes.txt"), "w").write("keep")
        try:
            DynamicEmbDump(p, model)
        except ValueError as e:
            assert "no dynamicemb checkpoint" in str(e), e
        else:
            raise AssertionError("dumped over a foreign folder")
        assert os.listdir(p) == ["notes.txt"]

    @check("unknown_table_names")
    def _():
        for names in ({"coll": ["nope"]}, {"nope": ["t0"]}, ["nope"]):
            try:
                DynamicEmbDump(os.path.join(root, "unknown"), model, table_names=names)
            except ValueError as e:
                assert "nope" in str(e), e
            else:
                raise AssertionError(f"table_names={names} was accepted")
            assert not os.path.exists(os.path.join(root, "unknown"))

    @check("table_selection")
    def _():
        fresh = c.build(CASE, world)
        c.train(fresh, CASE, rank, first=70)
        prior = c.contents(fresh)
        DynamicEmbLoad(good, fresh, table_names={"model.sparse.coll": ["t1"]}, optim=True)
        got = c.contents(fresh)
        c.assert_same_tables({"t1": got["t1"]}, {"t1": want["t1"]})
        c.assert_same_tables({"t0": got["t0"]}, {"t0": prior["t0"]})

    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):

        @check(f"precision_{name}")
        def _(dtype=dtype, name=name):
            p = _copy(good, os.path.join(root, name))
            _rewrite_dtype(p, dtype, name)
            fresh = c.build(CASE, world)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                DynamicEmbLoad(p, fresh, optim=True)
            assert any(f"checkpoint's values are torch.{name}" in str(w.message) for w in caught)
            got = c.contents(fresh)
            for t in want:
                for f in ("emb", "opt"):
                    assert torch.equal(got[t][f], want[t][f].to(dtype).float()), (t, f)
                assert torch.equal(got[t]["keys"], want[t]["keys"])

    for with_state in (False, True):

        @check(f"legacy_layout_{'with' if with_state else 'without'}_state")
        def _(with_state=with_state):
            p = os.path.join(root, f"legacy_{with_state}")
            _write_legacy(p, want, with_state)
            fresh = c.build(CASE, world)
            DynamicEmbLoad(p, fresh, optim=with_state)
            got = c.contents(fresh)
            for t in want:
                assert torch.equal(got[t]["keys"], want[t]["keys"])
                assert torch.equal(got[t]["emb"], want[t]["emb"])
                assert torch.equal(got[t]["scores"], want[t]["scores"])
                if with_state:
                    assert torch.equal(got[t]["opt"], want[t]["opt"])
                else:
                    assert torch.equal(got[t]["opt"], torch.zeros_like(want[t]["opt"]))

    return check.results


CHECKS = [
    "corrupted_values",
    "corrupted_keys_of_the_last_table",
    "truncated_values",
    "missing_file",
    "corrupted_meta",
    "corrupted_manifest",
    "missing_folder",
    "meta_without_the_dtype_keys",
    "optimizer_state_stays_float32_in_a_bfloat16_table",
    "missing_table",
    "no_optimizer_state",
    "dim_mismatch",
    "failure_while_applying_restores",
    "dump_refuses_a_foreign_folder",
    "unknown_table_names",
    "table_selection",
    "precision_float16",
    "precision_bfloat16",
    "legacy_layout_without_state",
    "legacy_layout_with_state",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return c.run_checks(_checks_world, str(tmp_path_factory.mktemp("bad")), CHECKS)


@pytest.mark.parametrize("name", CHECKS)
def test_check(results, name):
    assert results[name] == "ok", results[name]
