"""Round trips and resharding: tables trained and dumped by two gloo ranks,
loaded at one, two, three and four ranks and with every dist_type.
(Static tables sit beside dynamic ones where FBGEMM's CPU kernel has the
optimizer: SGD and row-wise Adagrad.)

After a load, every key's embedding, optimizer state (SGD, Adam, Adagrad,
row-wise Adagrad, FTRL) and score words equal the dumped ones, read straight
from the tables' state on both sides; every key is on the rank that owns it
at the new world size; the static TorchRec tables beside the dynamic ones are
untouched; an eval lookup reads the loaded rows. A table with less room than
the checkpoint needs keeps the highest-scored keys and reports the others.
Tables whose rows live in two tiers (a device cache over a host table, a
hybrid table) round-trip and reshard the same way.
"""

import dataclasses
import os

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb.dynamicemb_config import value_row_bytes
from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec


def _rows_bytes(optimizer: str, rows: int, dim: int = 4) -> int:
    """The bytes of ``rows`` rows of a dim-``dim`` float32 table."""
    opt = c.fused_params(optimizer)["optimizer"]
    return rows * value_row_bytes(opt, dim, torch.float32)


def cases() -> list[c.Case]:
    return [
        c.Case(
            "ec_rowwise_adagrad",
            "ec",
            [
                T("t0", 40, 4, dist_type="continuous"),
                T("t1", 24, 4, dist_type="roundrobin"),
                T("t2", 30, 4, dist_type="hash_roundrobin", initializer="uniform"),
                T("s0", 20, 4, dynamic=False),
            ],
            optimizer="rowwise_adagrad",
        ),
        c.Case(
            "ebc_sgd_lfu",
            "ebc",
            [
                T("t0", 40, 4, dist_type="hash_roundrobin", pooling="SUM"),
                T("t1", 24, 3, dist_type="continuous", pooling="MEAN"),
                T("s0", 10, 4, dynamic=False, static_sharding="table_wise"),
            ],
            optimizer="sgd",
            score_strategy=S.LFU,
        ),
        c.Case("ec_adam_step", "ec", [T("t0", 40, 4)], optimizer="adam", score_strategy=S.STEP),
        c.Case(
            "ec_adagrad_compound",
            "ec",
            [T("t0", 40, 4, dist_type="hash_roundrobin")],
            optimizer="adagrad",
            score_strategy=(S.TIMESTAMP, S.LFU),
        ),
        c.Case(
            "ebc_ftrl_customized",
            "ebc",
            [T("t0", 40, 4, dist_type="continuous")],
            optimizer="ftrl",
            score_strategy=S.CUSTOMIZED,
        ),
        c.Case(
            "ec_adam_no_eviction",
            "ec",
            [T("t0", 40, 4, dist_type="roundrobin")],
            optimizer="adam",
            score_strategy=S.NO_EVICTION,
            options={"init_capacity": 16},
            key_range=(0, 300),
            batch_size=8,
            max_length=8,
        ),
        # Rows over two tiers: a device cache of 16 rows over a host table,
        # and a hybrid table with 16 rows on the device tier.
        c.Case(
            "ec_adam_cached",
            "ec",
            [T("t0", 512, 4, dist_type="roundrobin")],
            optimizer="adam",
            options={"caching": True, "local_hbm_for_values": _rows_bytes("adam", 16)},
            key_range=(0, 200),
            batch_size=8,
            max_length=8,
        ),
        c.Case(
            "ec_sgd_hybrid",
            "ec",
            [T("t0", 512, 4, dist_type="hash_roundrobin")],
            optimizer="sgd",
            options={"local_hbm_for_values": _rows_bytes("sgd", 16)},
            key_range=(0, 200),
            batch_size=8,
            max_length=8,
        ),
        # More distinct keys than one rank's table holds: a load at one rank drops keys.
        c.Case(
            "ec_sgd_lfu_evicting",
            "ec",
            [T("t0", 100, 4, dist_type="hash_roundrobin")],
            optimizer="sgd",
            score_strategy=S.LFU,
            key_range=(0, 600),
            batch_size=16,
            max_length=8,
            steps=4,
        ),
    ]


SWEPT = "ec_rowwise_adagrad"  # also loaded with each dist_type for all its dynamic tables


def _with_dist_type(case: c.Case, dist_type: str) -> c.Case:
    tables = [dataclasses.replace(t, dist_type=dist_type) if t.dynamic else t for t in case.tables]
    return dataclasses.replace(case, tables=tables)


def _eval_batch(case: c.Case, rank: int):
    sc = case.scenario()
    return h.batch_for(sc, 1000, rank)


def _dump_world(rank, world, cases_, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    out = {}
    for case in cases_:
        model = c.build(case, world)
        c.train(model, case, rank)
        path = os.path.join(root, case.name)
        DynamicEmbDump(path, model, optim=True)
        fresh = c.build(case, world)
        DynamicEmbLoad(path, fresh, optim=True)
        out[case.name] = {"dumped": c.contents(model), "reloaded": c.contents(fresh)}
    return out


def _load(case, world, rank, path):
    from dynamicemb.checkpoint import load

    model = c.build(case, world)
    before = c.static_weights(model)
    report = load(path, model, optim=True)
    result = {
        "contents": c.contents(model),
        "static_before": before,
        "static_after": c.static_weights(model),
        "report": [(t.table, t.checkpoint_rows, t.loaded, t.dropped) for t in report.tables],
    }
    if case.kind == "ec":
        sc = case.scenario()
        batch = _eval_batch(case, rank)
        model.eval()
        with torch.no_grad():
            outs = h.local_outputs(sc, model(h.to_kjt(sc, batch).to(h.worker_device())))
        result["eval"] = (
            {t.feature: torch.cat([k for k, _ in batch[t.feature]]) for t in case.tables},
            outs,
        )
    return result


def _load_world(rank, world, cases_, root):
    out = {}
    for case in cases_:
        path = os.path.join(root, case.name)
        out[case.name] = _load(case, world, rank, path)
        if case.name == SWEPT:
            for d in c.DIST_TYPES:
                out[f"{case.name}@{d}"] = _load(_with_dist_type(case, d), world, rank, path)
    return out


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ckpt"))
    per_rank = h.run_world(_dump_world, 2, cases(), root)
    return root, per_rank


def test_round_trip_at_the_same_world_size(dumped):
    _, per_rank = dumped
    for case in cases():
        want = c.merge([r[case.name]["dumped"] for r in per_rank])
        got = c.merge([r[case.name]["reloaded"] for r in per_rank])
        c.assert_same_tables(got, want, what=case.name)
        for name in want:
            assert torch.equal(got[name]["rank"], want[name]["rank"]), (case.name, name)
            assert got[name]["step"] == want[name]["step"] > 0, (case.name, name)


def _owner(keys: torch.Tensor, world: int, spec: h.TableSpec) -> torch.Tensor:
    from dynamicemb.shard import route_keys

    return route_keys(keys, world, spec.dist_type, spec.num_embeddings)


def _check_loaded(case: c.Case, want, per_rank_results, world: int, what: str) -> None:
    got = c.merge([r["contents"] for r in per_rank_results])
    specs = {t.name: t for t in case.tables}
    for r in per_rank_results:  # static tables are TorchRec's, not the checkpoint's
        assert sorted(r["static_before"]) == sorted(r["static_after"])
        for k, v in r["static_before"].items():
            assert torch.equal(v, r["static_after"][k]), (what, k)
    reports = {
        name: (rows, loaded, dropped)
        for name, rows, loaded, dropped in per_rank_results[0]["report"]
    }
    for name, w in want.items():
        g = got[name]
        assert torch.equal(g["rank"], _owner(g["keys"], world, specs[name])), (what, name)
        rows, loaded, dropped = reports[name]
        assert (rows, loaded, dropped) == (w["keys"].numel(), g["keys"].numel(), rows - loaded)
        assert g["step"] == w["step"], (what, name)
        if dropped == 0:
            c.assert_same_tables({name: g}, {name: w}, what=what)
            continue
        # Fewer rows than the checkpoint: each kept key has its rows, and
        # each rank's table (one bucket) kept its highest-scored keys.
        assert case.name == "ec_sgd_lfu_evicting" and world == 1, (what, name, dropped)
        pos = torch.searchsorted(w["keys"], g["keys"])
        assert torch.equal(w["keys"][pos], g["keys"])
        for f in ("emb", "opt", "scores"):
            assert torch.equal(w[f][pos], g[f]), (what, name, f)
        kept = torch.zeros(w["keys"].numel(), dtype=torch.bool)
        kept[pos] = True
        assert g["keys"].numel() == 128  # the table's one bucket is full
        assert int(w["scores"][kept, 0].min()) >= int(w["scores"][~kept, 0].max())
    for r in per_rank_results:
        if "eval" not in r:
            continue
        keys_by_feature, outs = r["eval"]
        for t in case.tables:
            if not t.dynamic:
                continue
            w = got[t.name]
            keys = keys_by_feature[t.feature]
            pos = torch.searchsorted(w["keys"], keys).clamp(max=max(w["keys"].numel() - 1, 0))
            present = w["keys"].numel() > 0
            found = (
                (w["keys"][pos] == keys) if present else torch.zeros_like(keys, dtype=torch.bool)
            )
            expect = torch.where(found[:, None], w["emb"][pos], 0.0)
            got_rows = outs[t.feature].float()
            torch.testing.assert_close(got_rows, expect, msg=lambda m: f"{what} eval: {m}")


@pytest.mark.parametrize("world", [1, 3, 4])
def test_load_at_another_world_size_and_dist_type(dumped, world):
    root, per_rank = dumped
    results = h.run_world(_load_world, world, cases(), root)
    for case in cases():
        want = c.merge([r[case.name]["dumped"] for r in per_rank])
        _check_loaded(case, want, [r[case.name] for r in results], world, f"{case.name}@{world}")
        if case.name == SWEPT:
            for d in c.DIST_TYPES:
                swept = _with_dist_type(case, d)
                key = f"{case.name}@{d}"
                _check_loaded(swept, want, [r[key] for r in results], world, f"{key}@{world}")


@pytest.mark.multigpu
def test_nccl_dump_at_two_gpus_load_at_one(tmp_path):
    """The same on GPUs: two NCCL ranks train and dump, one GPU loads."""
    root = str(tmp_path)
    per_rank = h.run_world(_dump_world, 2, cases(), root, device_type="cuda")
    results = h.run_world(_load_world, 1, cases(), root, device_type="cuda")
    for case in cases():
        want = c.merge([r[case.name]["dumped"] for r in per_rank])
        again = c.merge([r[case.name]["reloaded"] for r in per_rank])
        c.assert_same_tables(again, want, what=f"{case.name} reloaded on 2 GPUs")
        _check_loaded(case, want, [r[case.name] for r in results], 1, f"{case.name}@1 GPU")
