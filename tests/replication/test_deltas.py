"""What an incremental dump holds, and what a replay writes.

Time-based deltas (TIMESTAMP, compound) hold exactly the keys touched since
the threshold, with ages for timestamps; absolute-score deltas (STEP, LFU)
the keys whose score reaches it; every delta the slots, embeddings,
optimizer state at the checkpoint width, a sequence number and a checksum.
Replays write per ReplayContent: without optimizer state a key that keeps
its slot keeps its state and a taken-over row starts fresh; without scores a
key is scored as just inserted. Runs on a one-rank gloo world (and NCCL on a
GPU, marked gpu), each check against the table's raw state.
"""

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb import ReplayContent
from tests.checkpoint import ckpt_harness as c
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _batch_keys(cs, step, rank=0) -> torch.Tensor:
    batch = h.batch_for(cs.scenario(), step, rank)
    return torch.unique(torch.cat([k for t in cs.tables for k, _ in batch[t.feature]]))


def _row(contents, name, keys):
    """Rows of ``keys`` in a table's contents (keys sorted there)."""
    t = contents[name]
    idx = torch.searchsorted(t["keys"], keys)
    assert torch.equal(t["keys"][idx], keys)
    return {f: t[f][idx] for f in ("emb", "opt", "scores")}


def _dump_contents(rank, world):
    from dynamicemb.incremental_dump import get_score, incremental_dump
    from dynamicemb.storage.score_function import table_score_columns

    out = []
    # Room for every key: what a dump holds is decided by scores alone.
    cases = [
        (r.case("ts", S.TIMESTAMP, "adam", num_embeddings=2048), "time"),
        (r.case("ts_lfu", (S.TIMESTAMP, S.LFU), "rowwise_adagrad", num_embeddings=2048), "time"),
        (r.case("lfu_ts", (S.LFU, S.TIMESTAMP), "sgd", num_embeddings=2048), "time"),
        (r.case("step", S.STEP, "adagrad", num_embeddings=2048), "step"),
        (r.case("lfu", S.LFU, "adam", num_embeddings=2048), "lfu"),
    ]
    for cs, kind in cases:
        model = c.build(cs, world)
        emb = c.kernels(model)[0].emb_module
        cols = table_score_columns(emb.strategies)
        threshold = get_score(model)
        for step in range(3):
            if kind == "lfu":
                threshold = 3
            c.train(model, cs, rank, steps=1, first=step)
            delta = incremental_dump(model, threshold)[r.COLL]
            threshold = {r.COLL: {"t0": delta.meta[0]["current_score"]}}
            meta = delta.meta[0]
            now = c.contents(model)["t0"]
            keys = delta.keys[0]
            if kind == "time":  # exactly the keys this step touched
                assert torch.equal(keys.sort().values, _batch_keys(cs, step)), cs.name
            elif kind == "step":
                assert torch.equal(keys.sort().values, _batch_keys(cs, step))
                assert meta["current_score"] == step + 2  # the next forward's step
            else:  # LFU: absolute frequency >= 3
                want = now["keys"][now["scores"][:, 0] >= 3]
                assert torch.equal(keys.sort().values, want)
            rows = _row({"t0": now}, "t0", keys.sort().values)
            order = torch.argsort(keys)
            assert torch.equal(delta.values[0][order], rows["emb"])
            sd = emb.rows.state_dim(0)
            if sd:
                # At the checkpoint files' width (rowwise Adagrad: its one scalar).
                assert torch.equal(delta.optimizer_states[0][order], rows["opt"][:, :sd])
                assert delta.optimizer_states[0].shape[1] == sd
            else:
                assert delta.optimizer_states[0] is None
            user = rows["scores"][:, cols]
            for j, s in enumerate(emb.strategies):
                if s == S.TIMESTAMP:  # an age against the dump's clock reading
                    user[:, j] = meta["current_score"] - user[:, j]
                    assert (user[:, j] >= 0).all()
            assert torch.equal(delta.scores[0][order], user), cs.name
            # Slots: where the keys sit in the table.
            lo, hi = emb.rows.hash_table.slot_range(0)
            assert torch.equal(emb.rows.hash_table.keys[lo:hi][meta["slot_index"]].cpu(), keys)
            assert meta["sequence"] == step + 1
            assert meta["current_capacity"] == hi - lo
            assert meta["row_capacity"] == (hi - lo,)
            assert meta["bucket_capacity"] == 16
            assert meta["num_scores"] == len(cols)
            assert meta["world_size"] == world
            assert meta["table_options"].score_strategy == cs.score_strategy
            out.append(cs.name)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_deltas_hold_what_changed(device):
    h.run_world(_dump_contents, 1, device_type=device)


def _refusals(rank, world):
    from dynamicemb.incremental_dump import incremental_dump, pop_evicted_keys

    cs = r.case("cont", S.TIMESTAMP, dist_type="continuous")
    model = c.build(cs, world)
    c.train(model, cs, rank, steps=10)  # ~200 distinct keys for 128 slots: evicts
    with pytest.raises(NotImplementedError, match="continuous"):
        incremental_dump(model, 0)
    # Nothing was drained by the refused dump.
    assert pop_evicted_keys(model)[r.COLL]["t0"].numel() > 0
    cs = r.case("ts", S.TIMESTAMP, tables=("t0", "t1"))
    model = c.build(cs, world)
    c.train(model, cs, rank, steps=2)
    for bad, msg in (
        ("5", "score_threshold"),
        (1.5, "score_threshold"),
        ({r.COLL: {"nope": 1}}, "no dynamic table 'nope'"),
        ({"model.other": {"t0": 1}}, "no collection"),
        ({r.COLL: {"t0": 1.5}}, "must be an int"),
    ):
        with pytest.raises(ValueError, match=msg):
            incremental_dump(model, bad)
    emb = c.kernels(model)[0].emb_module
    assert emb.rows.delta_sequence == [0, 0]
    # A dict dumps the tables it names only: only their sequence moves.
    delta = incremental_dump(model, {"coll": {"t1": 0}})[r.COLL]
    assert delta.table_names == ["t1"]
    assert emb.rows.delta_sequence == [0, 1]
    return True


def test_bad_thresholds_and_continuous_tables_are_refused():
    h.run_world(_refusals, 1)


def _content(rank, world, device_type):
    from dynamicemb.incremental_dump import get_score, incremental_dump, replay_increment
    from dynamicemb.replication import replay_by_key

    cs = r.case("ts", S.TIMESTAMP, "adam")
    source = c.build(cs, world)
    threshold = get_score(source)
    deltas = []
    for step in range(2):
        c.train(source, cs, rank, steps=1, first=step)
        d = incremental_dump(source, threshold)
        threshold = {r.COLL: {"t0": d[r.COLL].meta[0]["current_score"]}}
        deltas.append(d)
    final = c.contents(source)["t0"]
    replica = c.build(cs, world)
    replay_increment(replica, deltas[0])
    before = c.contents(replica)["t0"]
    emb = c.kernels(replica)[0].emb_module
    t0 = int(emb.rows.hash_table.timer().item())
    stats = replay_increment(replica, deltas[1], ReplayContent.EMBEDDING_ONLY)
    s = stats[r.COLL]["t0"]
    assert s.upserted == deltas[1][r.COLL].keys[0].numel() and s.skipped == 0
    after = c.contents(replica)["t0"]
    assert torch.equal(after["keys"], final["keys"])
    assert torch.equal(after["emb"], final["emb"])
    kept = torch.isin(after["keys"], before["keys"])
    d1_slots = dict(
        zip(deltas[1][r.COLL].keys[0].tolist(), deltas[1][r.COLL].meta[0]["slot_index"].tolist())
    )
    for i, k in enumerate(after["keys"].tolist()):
        if k not in d1_slots:
            continue
        if kept[i]:  # held its slot already: kept its state
            j = int(torch.searchsorted(before["keys"], torch.tensor(k)))
            assert torch.equal(after["opt"][i], before["opt"][j])
        else:  # a row taken over or new: Adam's initial state
            assert not after["opt"][i].any()
        # Without scores: as just inserted here (the replica's clock).
        assert int(after["scores"][i, 0]) >= t0
    # By key, with everything: scores are the source's ages on this clock.
    other = c.build(r.replica_case(cs), world)
    t0 = int(c.kernels(other)[0].emb_module.rows.hash_table.timer().item())
    for d in deltas:
        replay_by_key(other, d)
    t1 = int(c.kernels(other)[0].emb_module.rows.hash_table.timer().item())
    got = c.contents(other)["t0"]
    assert torch.equal(got["opt"], final["opt"])
    last = deltas[1][r.COLL]
    ages = dict(zip(last.keys[0].tolist(), last.scores[0][:, 0].tolist()))
    for k, ts in zip(got["keys"].tolist(), got["scores"][:, 0].tolist()):
        if k in ages:
            assert t0 - ages[k] <= ts <= t1 - ages[k]
    return True


@pytest.mark.parametrize("device", DEVICES)
def test_replay_content(device):
    h.run_world(_content, 1, device, device_type=device)


def _storage_modes(rank, world, mode):
    """A job whose tables live in a storage mode (a device cache over a host
    table, a hybrid table) replicated by slot (same mode) and by key (host
    rows); an external storage is refused."""
    import dataclasses

    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb.dynamicemb_config import value_row_bytes
    from dynamicemb.incremental_dump import get_score, incremental_dump, replay_increment
    from dynamicemb.replication import replay_by_key

    rb = value_row_bytes(EmbOptimType.ADAM, 4, torch.float32)
    storage = {
        "cache": dict(caching=True, local_hbm_for_values=32 * rb),
        "hybrid": dict(local_hbm_for_values=64 * rb),
    }[mode]
    base = r.case("modes", S.TIMESTAMP, "adam")
    cs = dataclasses.replace(base, options=dict(base.options, **storage))
    source = c.build(cs, world)
    by_slot = c.build(cs, world)
    by_key = c.build(r.replica_case(base), world)
    threshold = get_score(source)
    for step in range(6):
        c.train(source, cs, rank, steps=1, first=step)
        d = incremental_dump(source, threshold)
        threshold = {r.COLL: {"t0": d[r.COLL].meta[0]["current_score"]}}
        replay_increment(by_slot, d)
        replay_by_key(by_key, d)
    for k in c.kernels(source) + c.kernels(by_slot):
        k.emb_module.flush()  # contents reads the backing table's keys
    want = c.contents(source)
    r.assert_replica_equals(c.contents(by_slot), want, S.TIMESTAMP, f"{mode} by slot")
    r.assert_replica_equals(c.contents(by_key), want, S.TIMESTAMP, f"{mode} by key")
    return True


@pytest.mark.parametrize("mode", ["cache", "hybrid"])
def test_storage_modes_replicate(mode):
    h.run_world(_storage_modes, 1, mode)
