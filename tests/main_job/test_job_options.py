"""The main job's eviction and optimizer options (examples/train_args.py):
--score-strategy, --admission-threshold and --refuse-cold-keys become the
dynamic tables' options; --emb-optimizer rowwise_rmsprop_ar (--ar-alpha,
--row-warmup-steps) trains the dynamic tables while the static one keeps
rowwise Adagrad, as a checkpoint's optimizer state shows; the summary counts
the training lookups, rejections and refusals."""

import json
import os

import job_harness as j
import pytest
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
