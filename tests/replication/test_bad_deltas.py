"""A replay refuses what it must not apply and then changes nothing: a
delta corrupted in memory or on disk, one that lacks data, one for another
layout (by slot), a table sharded with dist_type="continuous" (the order of
deltas is the stream's concern: test_stream_faults.py). After each refusal the replica's
tables (keys in every slot, rows, scores, sequence) are exactly as before,
and the right deltas still apply afterwards."""

import copy
import os

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _state(model):
    """Everything a replay can change: contents, slots, delta sequences."""
    return {
        "contents": c.contents(model),
        "slots": r.slot_keys(model),
        "sequence": [list(k.emb_module.rows.delta_sequence) for k in c.kernels(model)],
    }


def _assert_same_state(a, b, what):
    assert a["sequence"] == b["sequence"], what
    for name in a["slots"]:
        assert torch.equal(a["slots"][name], b["slots"][name]), f"{what}: {name} slots"
    c.assert_same_tables(a["contents"], b["contents"], what=what)


def _refusals(rank, world, folder, device_type):
    from dynamicemb.incremental_dump import get_score, incremental_dump, replay_increment
    from dynamicemb.replication import DeltaError, read_delta, replay_by_key, write_delta

    # Two tables fused in one module: a corrupted t1 keeps t0 from being written too.
    cs = r.case("pair", S.TIMESTAMP, tables=("t0", "t1"))
    source = c.build(cs, world)
    threshold = get_score(source)
    deltas = []
    for step in range(3):
        c.train(source, cs, rank, steps=1, first=step)
        d = incremental_dump(source, threshold)
        threshold = {
            r.COLL: {n: m["current_score"] for n, m in zip(d[r.COLL].table_names, d[r.COLL].meta)}
        }
        deltas.append(d)
    final = _state(source)

    replica = c.build(cs, world)
    replay_increment(replica, deltas[0])
    base = _state(replica)

    def refused(fn, exc, match, what):
        with pytest.raises(exc, match=match):
            fn()
        _assert_same_state(_state(replica), base, what)

    def corrupt(column, table=1, edit=None):
        bad = copy.deepcopy(deltas[1][r.COLL])
        t = bad.meta[table]["slot_index"] if column == "slot_index" else getattr(bad, column)[table]
        if edit is not None:
            edit(t)
        else:
            t.view(-1)[0] += 1
        return bad

    for column in ("values", "keys", "scores", "optimizer_states", "slot_index"):
        bad = {r.COLL: corrupt(column)}
        refused(lambda: replay_increment(replica, bad), DeltaError, "corrupted", column)
    bad = copy.deepcopy(deltas[1])
    bad[r.COLL].meta[0]["current_capacity"] = 1 << 20
    refused(lambda: replay_increment(replica, bad), DeltaError, "corrupted", "meta")
    bad = copy.deepcopy(deltas[1])
    bad[r.COLL].values.pop()
    refused(lambda: replay_increment(replica, bad), ValueError, "missing per-table", "lengths")
    bad = copy.deepcopy(deltas[1])
    bad[r.COLL].meta[0]["checksum"] = "0"
    refused(lambda: replay_increment(replica, bad), ValueError, "checksum", "a str checksum")

    # On disk: a flipped byte or a truncated file is named when read.
    path = write_delta(folder, 2, deltas[1])
    values = os.path.join(path, r.COLL, "t1_values")
    with open(values, "r+b") as f:
        f.seek(5)
        byte = f.read(1)
        f.seek(5)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DeltaError, match="t1_values is corrupted"):
        read_delta(path)
    with open(values, "r+b") as f:
        f.seek(5)
        f.write(byte)
    read_delta(path)
    with open(values, "r+b") as f:
        f.truncate(7)
    with pytest.raises(DeltaError, match="bytes"):
        read_delta(path)

    # Another layout: refused by slot (the field named), taken by key.
    other = c.build(r.replica_case(cs), world)
    replay_by_key(other, deltas[0])
    before = _state(other)
    with pytest.raises(ValueError, match="current_capacity"):
        replay_increment(other, deltas[1])
    _assert_same_state(_state(other), before, "layout")

    # Collections and tables the model lacks are skipped with a warning.
    odd = copy.deepcopy(deltas[1])
    odd["model.elsewhere"] = odd.pop(r.COLL)
    with pytest.warns(UserWarning, match="no collection"):
        assert replay_increment(replica, odd) == {}
    _assert_same_state(_state(replica), base, "unknown collection")

    # The right deltas still apply, and the replica ends as the source.
    replay_increment(replica, deltas[1])
    replay_increment(replica, deltas[2])
    end = _state(replica)
    r.assert_replica_equals(end["contents"], final["contents"], S.TIMESTAMP, "end")
    for name in final["slots"]:
        assert torch.equal(end["slots"][name], final["slots"][name])

    # continuous: refused by slot.
    cont = r.case("cont", S.TIMESTAMP, dist_type="continuous")
    model = c.build(cont, world)
    forged = copy.deepcopy(deltas[1])
    forged[r.COLL].table_names[0] = "t0"
    with pytest.raises(NotImplementedError, match="continuous"):
        replay_increment(model, {r.COLL: forged[r.COLL]})
    return True


@pytest.mark.parametrize("device", DEVICES)
def test_bad_deltas_are_refused_and_change_nothing(tmp_path, device):
    h.run_world(_refusals, 1, str(tmp_path), device, device_type=device)


def _hand_delta():
    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.replication import DeltaDumpResult

    delta = DeltaDumpResult()
    delta.append(
        {
            "table_names": "t0",
            "keys": torch.tensor([3, 9]),
            "values": torch.arange(8, dtype=torch.float32).reshape(2, 4),
            "optimizer_states": None,
            "scores": torch.tensor([[1], [2]]),
            "erased_keys": torch.tensor([5]),
            "evicted_keys": None,
            "meta": {
                "current_score": 3,
                "slot_index": torch.tensor([0, 1]),
                "current_capacity": 128,
                "row_capacity": (128,),
                "bucket_capacity": 128,
                "num_scores": 1,
                "world_size": 1,
                "table_options": DynamicEmbTableOptions(dim=4),
                "sequence": 1,
                "run": "r",
                "epoch": 0,
                "rank": None,
            },
        }
    )
    return {"model.coll": delta}


def test_a_manifest_naming_files_outside_its_folder_is_refused(tmp_path):
    import json

    from dynamicemb.io.files import encode_manifest
    from dynamicemb.replication import DeltaError, read_delta, write_delta

    path = write_delta(str(tmp_path / "stream"), 1, _hand_delta())
    manifest = os.path.join(path, "dynamicemb_delta.json")
    with open(manifest, "rb") as f:
        good = f.read()
    assert torch.equal(read_delta(path)[1]["model.coll"].keys[0], torch.tensor([3, 9]))
    # A file outside the delta's folder, and a manifest (its checksum
    # recomputed: it authenticates nothing) that names it.
    outside = tmp_path / "t0_keys"
    outside.write_bytes((tmp_path / path / "model.coll" / "t0_keys").read_bytes())
    for name in ("../../../t0_keys", str(outside), "t0_values", ".."):
        body = json.loads(good)
        del body["checksum"]
        body["collections"]["model.coll"][0]["columns"]["keys"]["file"]["file"] = name
        with open(manifest, "wb") as f:
            f.write(encode_manifest(body))
        with pytest.raises(DeltaError, match="malformed.*names the file"):
            read_delta(path)
    body = json.loads(good)
    del body["checksum"]
    body["collections"] = {"../x": body["collections"]["model.coll"]}
    with open(manifest, "wb") as f:
        f.write(encode_manifest(body))
    with pytest.raises(DeltaError, match="collection '../x' cannot name a file"):
        read_delta(path)
