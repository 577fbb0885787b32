"""torch.distributed.checkpoint with DynamicEmbStateful: the dynamic tables
saved in one dcp.save call together with a dense tensor, by two gloo ranks,
and loaded in one dcp.load call at one and three ranks through dcp_reader;
a dcp.load with DCP's own reader (which unpickles) is refused on every rank
unless the stateful trusts the checkpoint. dcp_reader runs no code from a
crafted folder: its metadata or an entry that calls open() is refused."""

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
    import pytest
    import torch.distributed.checkpoint as dcp

    from dynamicemb.checkpoint import CheckpointError, DynamicEmbStateful, dcp_reader

    out = {}
    for case in CASES:
        model = c.build(case, world)
        path = os.path.join(root, case.name)
        before = c.contents(model)
        dense = {"w": torch.zeros(6)}
        # DCP's own reader unpickles the files: refused on every rank before
        # anything is read, the tables and the dense tensor as they were.
        with pytest.raises(CheckpointError, match="reader that unpickles") as refused:
            dcp.load({"dense": dense, "dynamicemb": DynamicEmbStateful(model)}, checkpoint_id=path)
        c.assert_same_tables(c.contents(model), before, what="refused")
        assert torch.equal(dense["w"], torch.zeros(6))
        if world == 1:  # a checkpoint one trusts: DCP's reader, on purpose
            stateful = DynamicEmbStateful(model, trusted_checkpoint=True)
            dcp.load({"dense": dense, "dynamicemb": stateful}, checkpoint_id=path)
            out[case.name + "/trusted"] = c.contents(model)
            model = c.build(case, world)
            dense = {"w": torch.zeros(6)}
        dcp.load(
            {"dense": dense, "dynamicemb": DynamicEmbStateful(model)},
            storage_reader=dcp_reader(path),
        )
        out[case.name] = {
            "contents": c.contents(model),
            "dense": dense["w"],
            "refused": str(refused.value),
        }
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
                assert x[case.name]["refused"] == loaded[0][case.name]["refused"]
            if world == 1:
                c.assert_same_tables(loaded[0][case.name + "/trusted"], want, what="trusted")


class _Payload:
    """Unpickling it creates the file ``path``: what a crafted checkpoint
    could run instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_dcp_reader_runs_no_code_from_the_files(tmp_path):
    import pickle
    import warnings

    import pytest
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from dynamicemb.checkpoint import CheckpointError, dcp_reader

    warnings.simplefilter("ignore")  # DCP without a process group
    marker = str(tmp_path / "ran")
    good = str(tmp_path / "good")
    dcp.save({"w": torch.arange(4.0), "t": ("x", torch.ones(2))}, checkpoint_id=good, no_dist=True)
    out = {"w": torch.zeros(4), "t": None}
    dcp.load(out, storage_reader=dcp_reader(good), no_dist=True)
    assert torch.equal(out["w"], torch.arange(4.0)) and out["t"][0] == "x"

    # An entry whose pickle calls open(): DCP's own reader runs it, ours refuses.
    bad = str(tmp_path / "entry")
    dcp.save({"w": torch.arange(4.0), "t": _Payload(marker)}, checkpoint_id=bad, no_dist=True)
    out = {"w": torch.zeros(4), "t": None}
    # (DCP wraps what a reader raises in its CheckpointException, a BaseException.)
    with pytest.raises(CheckpointException, match="entry 't' is not plain data") as e:
        dcp.load(out, storage_reader=dcp_reader(bad), no_dist=True)
    assert "CheckpointError" in str(e.value)
    assert not os.path.exists(marker)
    dcp.load({"w": torch.zeros(4), "t": None}, checkpoint_id=bad, no_dist=True)
    assert os.path.exists(marker)  # the attack the reader stops
    os.remove(marker)

    # Metadata that calls open(): refused by name before anything is read.
    with open(os.path.join(good, ".metadata"), "wb") as f:
        pickle.dump(_Payload(marker), f)
    with pytest.raises(CheckpointException, match="asks for io.open"):
        dcp.load({"w": torch.zeros(4), "t": None}, storage_reader=dcp_reader(good), no_dist=True)
    with pytest.raises(CheckpointError, match="asks for io.open"):
        dcp_reader(good).read_metadata()
    assert not os.path.exists(marker)


def test_dcp_load_names_a_damaged_folder(tmp_path):
    # A truncated metadata or data file, a missing one: a CheckpointError
    # naming the folder and what failed, not DCP's CheckpointException (which
    # names only the ranks) nor an EOFError without the file.
    import re
    import warnings

    import pytest
    import torch.distributed.checkpoint as dcp

    from dynamicemb.checkpoint import CheckpointError
    from dynamicemb.checkpoint.dcp_reader import dcp_load

    warnings.simplefilter("ignore")  # DCP without a process group
    state = {"w": torch.arange(64.0), "t": torch.ones(8, 4)}

    def damaged(name: str, damage) -> str:
        path = str(tmp_path / name)
        dcp.save(state, checkpoint_id=path, no_dist=True)
        (data,) = [n for n in os.listdir(path) if n.endswith(".distcp")]
        damage(path, data)
        return path

    def cut(file: str) -> None:
        with open(file, "r+b") as f:
            f.truncate(os.path.getsize(file) // 2)

    cases = [
        damaged("meta_cut", lambda p, d: cut(os.path.join(p, ".metadata"))),
        damaged("data_cut", lambda p, d: cut(os.path.join(p, d))),
        damaged("data_gone", lambda p, d: os.remove(os.path.join(p, d))),
        str(tmp_path / "no_folder"),
    ]
    for path in cases:
        out = {"w": torch.zeros(64), "t": torch.zeros(8, 4)}
        with pytest.raises(CheckpointError, match="^" + re.escape(path) + ": "):
            dcp_load(out, path, no_dist=True)
        assert torch.equal(out["w"], torch.zeros(64)), path
