"""DynamicEmbDump / DynamicEmbLoad as the spec states them, over two gloo
ranks, through the spec's names only.

- ``pg``: "the process group used to control the communication scope";
  a group that is not the tables' sharding is refused.
- Values "are stored at the precision the table holds them at, not widened
  to float32" (fp16, bf16), recorded in the meta JSON, and load back.
- A compound score strategy writes "each key's scores in the tuple order",
  and "a checkpoint is interchangeable only between tables configured with
  the same tuple order".
- ``training=False`` tables (no optimizer state) load a training checkpoint.
- A table with ``external_storage`` (the spec's demo passes the Storage
  subclass, here ``tests/storage/py_dict_storage.py``'s) dumps and loads, and
  its checkpoint loads into the same table without the storage.

The files are read by the folder format of docs/checkpoint.md.
"""

import glob
import json
import os

import pytest
import torch
import torch.distributed as dist

from tests.spec import spec_model as sm

S_KEYS = torch.arange(0, 80)


def _options(**kwargs):
    from dynamicemb import DynamicEmbTableOptions

    return DynamicEmbTableOptions(**kwargs)


def _error(fn) -> str | None:
    """repr of the ValueError ``fn()`` raises, None when it raises none."""
    try:
        fn()
    except ValueError as e:
        return repr(e)
    return None


# ------------------------------------------------------------------- pg --


def _pg_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    # Every rank its own model, sharded over a group of one: the default group
    # (two ranks) is not the tables' sharding.
    groups = [dist.new_group([r]) for r in range(world)]
    mine = groups[rank]
    tables = [sm.Table("t", _options())]
    model = sm.build(tables, pg=mine)
    sm.train(model, tables, range(3), rank)
    path = os.path.join(root, f"ckpt_{rank}")
    DynamicEmbDump(path, model, optim=True, pg=mine)
    fresh = sm.build(tables, pg=mine)
    untouched = sm.lookup(fresh, tables, S_KEYS)
    out = {
        "dump_default_group": _error(
            lambda: DynamicEmbDump(os.path.join(root, f"other_{rank}"), model)
        ),
        "load_default_group": _error(lambda: DynamicEmbLoad(path, fresh, optim=True)),
        "after_refused_load": sm.lookup(fresh, tables, S_KEYS),
        "untouched": untouched,
        "no_folder": not os.path.exists(os.path.join(root, f"other_{rank}")),
    }
    DynamicEmbLoad(path, fresh, optim=True, pg=mine)
    return dict(out, **_loaded_and_one_step_on(model, fresh, tables, rank))


def _loaded_and_one_step_on(model, fresh, tables, rank) -> dict[str, dict[str, torch.Tensor]]:
    """Lookups of the source and of a model that loaded its checkpoint, now
    and after one more identical step (equal when the optimizer state came
    along)."""
    out = {"source": sm.lookup(model, tables, S_KEYS), "loaded": sm.lookup(fresh, tables, S_KEYS)}
    sm.train(model, tables, [3], rank)
    sm.train(fresh, tables, [3], rank)
    out["source_after"] = sm.lookup(model, tables, S_KEYS)
    out["loaded_after"] = sm.lookup(fresh, tables, S_KEYS)
    return out


def test_pg_scopes_dump_and_load_and_a_mismatching_group_is_refused(tmp_path):
    outs = sm.run_world(_pg_world, 2, str(tmp_path))
    for rank, out in enumerate(outs):
        for api in ("dump_default_group", "load_default_group"):
            assert out[api] is not None, f"rank {rank}: {api} was not refused"
            assert "sharded over 1 ranks" in out[api] and "has 2" in out[api], out[api]
        assert out["no_folder"]
        assert torch.equal(out["after_refused_load"]["t"], out["untouched"]["t"])
        assert out["source"]["t"].abs().sum() > 0
        assert torch.equal(out["loaded"]["t"], out["source"]["t"])
        assert torch.equal(out["loaded_after"]["t"], out["source_after"]["t"])
    # Each rank dumped its own model: two different tables.
    assert not torch.equal(outs[0]["source"]["t"], outs[1]["source"]["t"])


# ------------------------------------------------------------- precision --

_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _half_tables():
    return [sm.Table(name, _options(embedding_dtype=dtype)) for name, dtype in _HALF.items()]


def _half_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    tables = _half_tables()
    model = sm.build(tables)
    sm.train(model, tables, range(3), rank)
    path = os.path.join(root, "ckpt")
    DynamicEmbDump(path, model, optim=True)
    fresh = sm.build(tables)
    DynamicEmbLoad(path, fresh, optim=True)
    return _loaded_and_one_step_on(model, fresh, tables, rank)


def _folder(root):
    (folder,) = glob.glob(os.path.join(root, "ckpt", sm.COLLECTION))
    return folder


def _meta(folder, table):
    with open(os.path.join(folder, f"{table}_meta.json")) as f:
        return json.load(f)


def _file(folder, table, kind, rank, world=2):
    return os.path.join(folder, f"{table}_{kind}.rank_{rank}.world_size_{world}")


def test_fp16_and_bf16_tables_dump_at_their_precision_and_load_back(tmp_path):
    outs = sm.run_world(_half_world, 2, str(tmp_path))
    folder = _folder(str(tmp_path))
    for name, dtype in _HALF.items():
        meta = _meta(folder, name)
        assert meta["embedding_dtype"] == str(dtype).removeprefix("torch.")
        assert meta["embedding_dim"] == sm.DIM
        for rank in range(2):
            keys = os.path.getsize(_file(folder, name, "keys", rank)) // 8
            assert keys > 0
            values = os.path.getsize(_file(folder, name, "values", rank))
            assert values == keys * sm.DIM * 2, (name, rank, values, keys)
        for rank, out in enumerate(outs):
            got = out["loaded"][name]
            assert got.abs().sum() > 0
            # Rows held at the table's precision (the lookup's output is the
            # config's float32).
            assert torch.equal(got.to(dtype).to(got.dtype), got), (name, rank)
            assert torch.equal(got, out["source"][name]), (name, rank)
            assert torch.equal(out["loaded_after"][name], out["source_after"][name]), (name, rank)


# ---------------------------------------------------------- score order --


def _compound(order):
    from dynamicemb import DynamicEmbScoreStrategy as S

    strategies = {"lfu_ts": (S.LFU, S.TIMESTAMP), "ts_lfu": (S.TIMESTAMP, S.LFU)}[order]
    return [sm.Table("t", _options(score_strategy=strategies))]


def _order_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    out = {}
    for order in ("lfu_ts", "ts_lfu"):
        tables = _compound(order)
        model = sm.build(tables)
        sm.train(model, tables, range(3), rank)
        DynamicEmbDump(os.path.join(root, order), model)
        out[order] = sm.lookup(model, tables, S_KEYS)["t"]
    # The (LFU, TIMESTAMP) checkpoint loads into a table of that order ...
    same = sm.build(_compound("lfu_ts"))
    DynamicEmbLoad(os.path.join(root, "lfu_ts"), same)
    out["same_order"] = sm.lookup(same, _compound("lfu_ts"), S_KEYS)["t"]
    DynamicEmbDump(os.path.join(root, "reloaded"), same)
    # ... and not into one of the other order, which keeps what it holds.
    other = sm.build(_compound("ts_lfu"))
    sm.train(other, _compound("ts_lfu"), range(3), rank)
    before = sm.lookup(other, _compound("ts_lfu"), S_KEYS)["t"]
    out["other_order_error"] = _error(lambda: DynamicEmbLoad(os.path.join(root, "lfu_ts"), other))
    out["other_unchanged"] = torch.equal(before, sm.lookup(other, _compound("ts_lfu"), S_KEYS)["t"])
    return out


def _scores_by_key(root, name):
    """key -> (score columns) of one checkpoint, over both ranks' files."""
    folder = os.path.join(root, name, sm.COLLECTION)
    out = {}
    for rank in range(2):
        keys = torch.from_file(
            _file(folder, "t", "keys", rank),
            size=os.path.getsize(_file(folder, "t", "keys", rank)) // 8,
            dtype=torch.int64,
        )
        scores = torch.from_file(
            _file(folder, "t", "scores", rank), size=keys.numel() * 2, dtype=torch.int64
        ).reshape(-1, 2)
        out.update({int(k): s for k, s in zip(keys, scores)})
    return out


def _expected_frequencies(tables, steps):
    """How often each key occurred in the batches of both ranks."""
    keys = torch.cat([sm.batch_keys(tables, s, r)["t"] for s in steps for r in range(2)]).tolist()
    return {k: keys.count(k) for k in set(keys)}


def test_compound_scores_are_written_in_the_tuple_order_and_load_only_in_it(tmp_path):
    root = str(tmp_path)
    outs = sm.run_world(_order_world, 2, root)
    freq = _expected_frequencies(_compound("lfu_ts"), range(3))
    lfu_ts = _scores_by_key(root, "lfu_ts")
    ts_lfu = _scores_by_key(root, "ts_lfu")
    assert sorted(lfu_ts) == sorted(ts_lfu) == sorted(freq)
    meta = _meta(os.path.join(root, "lfu_ts", sm.COLLECTION), "t")
    assert meta["score_strategy"] == ["LFU", "TIMESTAMP"]
    for key, count in freq.items():
        # (LFU, TIMESTAMP): [frequency, timestamp]; (TIMESTAMP, LFU): the other way.
        assert int(lfu_ts[key][0]) == count == int(ts_lfu[key][1]), key
        assert int(lfu_ts[key][1]) > count and int(ts_lfu[key][0]) > count, key
    # Loaded in the same order, the scores are the checkpoint's.
    reloaded = _scores_by_key(root, "reloaded")
    assert sorted(reloaded) == sorted(lfu_ts)
    for key in lfu_ts:
        assert torch.equal(reloaded[key], lfu_ts[key]), key
    for rank, out in enumerate(outs):
        assert torch.equal(out["same_order"], out["lfu_ts"]), rank
        error = out["other_order_error"]
        assert error is not None, f"rank {rank}: the other order was not refused"
        assert "LFU" in error and "TIMESTAMP" in error, error
        assert out["other_unchanged"], rank


# ------------------------------------------------------- training=False --


def _serving_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    trained = [sm.Table("t", _options())]
    serving = [sm.Table("t", _options(training=False))]
    model = sm.build(trained)
    sm.train(model, trained, range(3), rank)
    path = os.path.join(root, "ckpt")
    DynamicEmbDump(path, model, optim=True)
    serve = sm.build(serving)
    DynamicEmbLoad(path, serve)
    return {
        "source": sm.lookup(model, trained, S_KEYS),
        "served": sm.lookup(serve, serving, S_KEYS),
    }


@pytest.mark.parametrize("world", [1, 2])
def test_a_training_false_table_serves_a_training_checkpoint(tmp_path, world):
    for out in sm.run_world(_serving_world, world, str(tmp_path)):
        assert out["source"]["t"].abs().sum() > 0
        assert torch.equal(out["served"]["t"], out["source"]["t"])


# ------------------------------------------------------ external_storage --


def _external_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.shard import dynamic_embedding_kernels
    from tests.storage.py_dict_storage import PyDictStorage

    # Adam rows of DIM: 3 * DIM float32; a device cache of 16 of them.
    external = [
        sm.Table(
            "t",
            _options(
                external_storage=PyDictStorage,
                caching=True,
                global_hbm_for_values=world * 16 * 3 * sm.DIM * 4,
            ),
        )
    ]
    plain = [sm.Table("t", _options())]
    model, reference = sm.build(external), sm.build(plain)
    sm.train(model, external, range(3), rank)
    sm.train(reference, plain, range(3), rank)
    path = os.path.join(root, "ckpt")
    DynamicEmbDump(path, model, optim=True)
    fresh, into_plain = sm.build(external), sm.build(plain)
    DynamicEmbLoad(path, fresh, optim=True)
    DynamicEmbLoad(path, into_plain, optim=True)
    out = {
        "reference": sm.lookup(reference, plain, S_KEYS),
        "source": sm.lookup(model, external, S_KEYS),
        "loaded": sm.lookup(fresh, external, S_KEYS),
        "into_plain": sm.lookup(into_plain, plain, S_KEYS),
    }
    sm.train(reference, plain, [3], rank)
    sm.train(fresh, external, [3], rank)
    out["reference_after"] = sm.lookup(reference, plain, S_KEYS)
    out["loaded_after"] = sm.lookup(fresh, external, S_KEYS)
    # Where the loaded rows live: the module built the storage from the class.
    (kernel,) = dynamic_embedding_kernels(fresh)
    storage = kernel.emb_module.storage.backing.storage
    out["in_storage"] = isinstance(storage, PyDictStorage) and storage.size(0)
    return out


def test_an_external_storage_table_dumps_and_loads(tmp_path):
    for rank, out in enumerate(sm.run_world(_external_world, 2, str(tmp_path))):
        assert out["reference"]["t"].abs().sum() > 0
        for what in ("source", "loaded", "into_plain"):
            assert torch.equal(out[what]["t"], out["reference"]["t"]), (rank, what)
        assert torch.equal(out["loaded_after"]["t"], out["reference_after"]["t"]), rank
        assert out["in_storage"] > 0, rank  # more keys than the cache's 16 rows
