"""The main job's --preset criteo (examples/criteo_preset.py): the tables'
rows within the memory budget, the preset's sizes and options, and the
model a checkpoint records."""

import criteo_preset  # examples/criteo_preset.py (pyproject: pytest pythonpath)
import job_model  # examples/job_model.py
import pytest
import train_dlrm  # examples/train_dlrm.py

C = criteo_preset.CARDINALITIES


@pytest.mark.parametrize("budget_rows", [26, 1000, 2_000_000, sum(C) - 1, sum(C), 10**10])
def test_capacities_fill_the_budget_with_one_cap(budget_rows):
    row = 520
    rows = criteo_preset.capacities(budget_rows * row, row)
    assert sum(rows) <= budget_rows and all(r >= 1 for r in rows)
    cap = max(rows)
    assert rows == [min(c, cap) for c in C]  # each its cardinality or the one cap
    if cap < max(C):  # a larger cap would not fit
        assert sum(min(c, cap + 1) for c in C) > budget_rows


def test_a_budget_below_one_row_a_feature_is_refused():
    with pytest.raises(ValueError, match="fewer than one for each of the 26 features"):
        criteo_preset.capacities(25 * 100, 100)


def test_preset_sizes_and_features():
    args = train_dlrm.parse_args(["--device", "cpu", "--preset", "criteo"])
    assert (args.dim, args.batch_size) == (criteo_preset.DIM, criteo_preset.BATCH_SIZE)
    assert args.emb_budget_gib == criteo_preset.EMB_BUDGET_GIB
    small = train_dlrm.parse_args(
        ["--device", "cpu", "--preset", "criteo", "--dim", "8", "--emb-budget-gib", "0.01"]
    )
    features = train_dlrm.DataSource(small).features
    assert len(features) == 26 and all(f.dynamic and f.max_length == 1 for f in features)
    assert [f.vocab for f in features] == list(C)
    assert sum(f.capacity for f in features) < sum(C)  # capped to the budget
    plain = train_dlrm.parse_args(["--device", "cpu"])
    assert (plain.dim, plain.batch_size) == (16, 256)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--interaction", "dcn"], "--interaction needs --preset criteo"),
        (["--emb-budget-gib", "4"], "--emb-budget-gib needs --preset criteo"),
        (["--preset", "criteo", "--emb-budget-gib", "0"], "--emb-budget-gib must be positive"),
    ],
)
def test_preset_options_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_dlrm.parse_args(["--device", "cpu", *argv])
    assert message in capsys.readouterr().err


def test_checkpoint_records_the_interaction():
    def describe(interaction):
        argv = ["--device", "cpu", "--preset", "criteo", "--interaction", interaction]
        args = train_dlrm.parse_args([*argv, "--emb-budget-gib", "0.01"])
        return job_model.model_description(train_dlrm.DataSource(args).features, args)

    dot, dcn = describe("dot"), describe("dcn")
    assert dot["preset"] == "criteo" and dot["over_arch"] == list(criteo_preset.OVER_ARCH)
    assert dcn["dcn_layers"] == criteo_preset.DCN_LAYERS and "dcn_layers" not in dot
