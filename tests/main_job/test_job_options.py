"""The main job's eviction and optimizer options (examples/train_args.py):
--score-strategy, --admission-threshold and --refuse-cold-keys become the
dynamic tables' options; --emb-optimizer rowwise_rmsprop_ar (--ar-alpha,
--row-warmup-steps) trains the dynamic tables while the static one keeps
rowwise Adagrad, as a checkpoint's optimizer state shows; the summary counts
the training lookups, rejections and refusals; --embedding-dtype stores the
dynamic tables' rows at that dtype (a run in FP8 checkpoints FP8 rows, a
float32 run resumes from them), a dtype the tables lack refused naming it."""

import json
import os

import job_harness as j
import pytest
import torch
import train_checkpoint  # examples/train_checkpoint.py (pyproject: pytest pythonpath)
import train_dlrm  # examples/train_dlrm.py

from dynamicemb import DynamicEmbScoreStrategy, FrequencyAdmissionStrategy

S = DynamicEmbScoreStrategy
STEPS = 60


def _dynamic_options(argv: list[str]) -> dict:
    args = train_dlrm.parse_args(["--device", "cpu", *argv])
    out = train_dlrm.constraints(train_dlrm.FEATURES, args, 1)
    return {f.table: out[f.table].dynamicemb_options for f in train_dlrm.FEATURES if f.dynamic}


@pytest.mark.parametrize(
    "flag, want",
    [("step", S.STEP), ("timestamp", S.TIMESTAMP), ("lfu", S.LFU)]
    + [("timestamp_lfu", (S.TIMESTAMP, S.LFU)), ("decayed_lfu", (S.TIMESTAMP, S.LFU))],
)
def test_score_strategy_flag(flag, want):
    for name, o in _dynamic_options(["--score-strategy", flag]).items():
        assert o.score_strategy == want, name
        assert (o.score_function is not None) == (flag == "decayed_lfu"), name
        assert o.refuse_cold_keys is False and o.admit_strategy is None, name


def test_refusal_and_admission_flags():
    argv = ["--score-strategy", "lfu", "--refuse-cold-keys", "--admission-threshold", "3"]
    for name, o in _dynamic_options(argv).items():
        assert o.refuse_cold_keys is True, name
        assert isinstance(o.admit_strategy, FrequencyAdmissionStrategy), name
        assert o.admit_strategy.threshold == 3, name


@pytest.fixture(scope="module")
def rmsprop_lfu_refusing(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("options")
    root = str(tmp / "ckpt")
    summary = str(tmp / "summary.json")
    rc, out = j.run_job(
        [
            *j.SMALL,
            *("--world-size", "1", "--steps", str(STEPS), "--checkpoint-dir", root),
            *("--emb-optimizer", "rowwise_rmsprop_ar", "--emb-lr", "0.02"),
            *("--ar-alpha", "0.05", "--row-warmup-steps", "4"),
            *("--score-strategy", "lfu", "--refuse-cold-keys"),
            *("--summary-json", summary),
        ]
    )
    assert rc in (0, 1) and os.path.exists(summary), out[-4000:]  # 1: the loss did not fall
    return j.summary(summary), train_checkpoint.step_dir(root, STEPS)


def test_dynamic_tables_keep_rmsprop_ars_state(rmsprop_lfu_refusing):
    from torch.distributed.checkpoint import FileSystemReader

    s, path = rmsprop_lfu_refusing
    with open(os.path.join(path, train_checkpoint.MANIFEST)) as f:
        assert json.load(f)["model"]["emb_optimizer"] == "rowwise_rmsprop_ar"
    tables = j.read_tables(os.path.join(path, train_checkpoint.TABLES))
    assert set(tables) == set(s["tables"])
    for name, t in tables.items():
        opt = t["opt"].double()
        # (EMA of mean(g^2), step of the last update, updates so far): every
        # stored row was trained.
        assert opt.shape == (t["keys"].numel(), 3), name
        assert (opt[:, 0] > 0).all(), name
        assert ((opt[:, 1] >= 1) & (opt[:, 1] <= STEPS)).all(), name
        assert ((opt[:, 2] >= 1) & (opt[:, 2] <= opt[:, 1])).all(), name
        assert t["scores"].shape[1] == 1 and (t["scores"] >= 1).all(), name  # LFU counts
    # The static table keeps rowwise Adagrad's accumulator (TorchRec's state).
    meta = FileSystemReader(os.path.join(path, train_checkpoint.TORCHREC)).read_metadata()
    static = [k for k in meta.state_dict_metadata if "t_device" in k and "momentum1" in k]
    assert static, sorted(meta.state_dict_metadata)


def test_summary_counts_lookups_rejections_and_refusals(rmsprop_lfu_refusing):
    s, _ = rmsprop_lfu_refusing
    for name, t in s["tables"].items():
        assert t["rejections"] == 0 and t["insert_failures"] == 0, name
        assert t["inserts"] - t["evictions"] == t["rows_held"], name
        # A training lookup finds its id, inserts it or refuses it.
        assert t["inserts"] + t["refusals"] <= t["train_lookups"], name
        assert t["train_lookups"] >= t["distinct_ids"], name


def test_admission_rejects_ids_seen_once(tmp_path):
    summary = str(tmp_path / "summary.json")
    rc, out = j.run_job(
        [
            *j.SMALL,
            *("--world-size", "1", "--steps", "30", "--summary-json", summary),
            *("--score-strategy", "decayed_lfu", "--admission-threshold", "2"),
        ]
    )
    assert rc in (0, 1), out[-4000:]
    for name, t in j.summary(summary)["tables"].items():
        assert t["rejections"] > 0 and t["refusals"] == 0, name
        assert t["inserts"] + t["rejections"] <= t["train_lookups"], name


# --------------------------------------------------------- --embedding-dtype --


def test_embedding_dtype_reaches_the_tables_and_their_budget():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb.dynamicemb_config import value_row_bytes

    def row(dtype):  # the job's dynamic tables: rowwise Adagrad, dim 16
        return value_row_bytes(EmbOptimType.EXACT_ROWWISE_ADAGRAD, 16, dtype)

    fp32 = _dynamic_options([])
    for name in ("float32", "float16", "bfloat16", "float8_e4m3fn"):
        dtype = getattr(torch, name)
        for table, o in _dynamic_options(["--embedding-dtype", name]).items():
            assert o.embedding_dtype == dtype, (name, table)
            # Every row in memory, each of its dtype's bytes.
            budget = fp32[table].global_hbm_for_values * row(dtype)
            assert o.global_hbm_for_values * row(torch.float32) == budget, (name, table)
    assert fp32["t_user"].embedding_dtype == torch.float32


@pytest.mark.parametrize("bad", ["float8_e5m2", "int8", "float64", "fp8"])
def test_a_bad_embedding_dtype_is_refused_naming_it(capsys, bad):
    with pytest.raises(SystemExit) as e:
        train_dlrm.parse_args(["--device", "cpu", "--embedding-dtype", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--embedding-dtype" in err and repr(bad) in err, err


FP8_STEPS = 20


@pytest.fixture(scope="module")
def fp8_then_float32(tmp_path_factory):
    """A one-rank run of FP8 rows to step FP8_STEPS, then a float32 run
    resumed from its checkpoint for ten more: (each summary, the
    checkpoint folder)."""
    tmp = tmp_path_factory.mktemp("fp8")
    root = str(tmp / "ckpt")
    summaries = []
    for dtype, steps, more in (
        ("float8_e4m3fn", FP8_STEPS, []),
        ("float32", FP8_STEPS + 10, ["--resume"]),
    ):
        summaries.append(str(tmp / f"{dtype}.json"))
        rc, out = j.run_job(
            [
                *j.SMALL,
                *("--world-size", "1", "--steps", str(steps), "--checkpoint-dir", root),
                *("--embedding-dtype", dtype, "--summary-json", summaries[-1], *more),
            ]
        )
        assert rc in (0, 1) and os.path.exists(summaries[-1]), out[-4000:]
    return [j.summary(p) for p in summaries], root


def _table_metas(path: str) -> list[dict]:
    folder = os.path.join(path, train_checkpoint.TABLES)
    with open(os.path.join(folder, "dynamicemb_checkpoint.json")) as f:
        manifest = json.load(f)
    metas = []
    for coll, tables in manifest["collections"].items():
        for name in tables:
            with open(os.path.join(folder, coll, f"{name}_meta.json")) as f:
                metas.append(json.load(f))
    return metas


def test_a_run_in_fp8_checkpoints_fp8_rows(fp8_then_float32):
    (s, _), root = fp8_then_float32
    assert s["embedding_dtype"] == "float8_e4m3fn"
    path = train_checkpoint.step_dir(root, FP8_STEPS)
    metas = _table_metas(path)
    assert len(metas) == 3
    for meta in metas:
        assert (meta["embedding_dtype"], meta["optim_state_dtype"]) == ("float8_e4m3fn", "float32")
    tables = j.read_tables(os.path.join(path, train_checkpoint.TABLES))
    for name, t in tables.items():
        v = t["emb"]
        assert v.shape == (t["keys"].numel(), 16) and bool(v.isfinite().all()), name
        # Each row is e4m3fn codes times its power-of-two scale, the one with
        # max |value| / scale in (224, 448].
        m, e = torch.frexp(v.abs().amax(1, keepdim=True).double() / 448)
        scale = torch.ldexp(torch.ones_like(m), e - (m == 0.5).int()).float()
        codes = v / scale
        assert torch.equal(codes.to(torch.float8_e4m3fn).float(), codes), name
        assert bool((codes.abs().amax(1) > 224).all()), name
        assert bool((t["opt"][:, 0] > 0).all()), name  # rowwise Adagrad's float32 sum


def test_a_float32_run_resumes_from_fp8_rows(fp8_then_float32):
    (_, s), root = fp8_then_float32
    assert s["embedding_dtype"] == "float32"
    assert s["resumed"]["step"] == FP8_STEPS
    metas = _table_metas(train_checkpoint.step_dir(root, FP8_STEPS + 10))
    assert {m["embedding_dtype"] for m in metas} == {"float32"}
    # The rows held at step FP8_STEPS were converted, not made anew: those
    # not updated since hold their FP8 values still (both sorted by key).
    tables = [
        j.read_tables(os.path.join(train_checkpoint.step_dir(root, step), train_checkpoint.TABLES))
        for step in (FP8_STEPS, FP8_STEPS + 10)
    ]
    kept = 0
    for name, b in tables[0].items():
        a = tables[1][name]
        ea = a["emb"][torch.isin(a["keys"], b["keys"])]
        eb = b["emb"][torch.isin(b["keys"], a["keys"])]
        kept += int((ea == eb).all(1).sum())
    assert kept > 0
