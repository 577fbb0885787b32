"""Smoke test of the main job (examples/train_dlrm.py): a short run on the CPU
with two gloo processes, checked through the summary it writes."""

import re

import pytest
import torch
import train_dlrm  # examples/train_dlrm.py (pyproject: pytest pythonpath)

WORLD_SIZE = 2
STEPS = 150
BATCH = 128


@pytest.fixture(scope="module")
def run():
    summary, out = train_dlrm.launch(
        f"--device cpu --world-size {WORLD_SIZE} --steps {STEPS} --batch-size {BATCH} "
        "--eval-batches 4 --log-window 25".split(),
        timeout=240,
    )
    assert summary is not None, out[-6000:]
    return summary, out


def test_loss_falls(run):
    s, _ = run
    assert s["world_size"] == WORLD_SIZE and s["steps"] == STEPS and s["batch_size"] == BATCH
    assert s["train_loss_last"] < s["train_loss_first"] - 0.02
    assert s["eval_loss_final"] < s["eval_loss_first"] - 0.02
    assert s["eval_auc_final"] > s["eval_auc_first"] + 0.05
    # No model beats the one that drew the labels (by more than noise).
    assert s["eval_loss_final"] > s["eval_loss_hidden_model"] - 0.02
    steps = [step for step, _ in s["train_loss_checkpoints"]]
    assert steps == sorted(steps) and steps[-1] == STEPS


def test_throughput_numbers(run):
    s, _ = run
    assert s["seconds"] > 0
    assert s["start_step"] == 0 and s["steps_run"] == STEPS and s["resumed"] is None
    assert s["steps_per_s"] == pytest.approx(STEPS / s["seconds"])
    assert s["examples_per_s"] == pytest.approx(STEPS * BATCH * WORLD_SIZE / s["seconds"])
    assert s["checkpoints"] == [] and s["checkpoint_seconds"] == 0
    assert s["data"] == {"source": "generated", "seed": 0, "alpha": 1.05}


def test_progress_lines_have_rates_and_time_left(run):
    """On a pipe, a line every tenth of the run: steps/s, examples/s and an
    ETA that agree with each other and reach 0 at the end."""
    _, text = run
    lines = [x for x in text.splitlines() if re.match(r"train +\d+/", x)]
    assert len(lines) >= 9, text[-3000:]
    pattern = (
        r"train +(\d+)/(\d+) \( *\d+%\) ([\d.]+) steps/s, ([\d,]+) examples/s, "
        r"ETA (\d+):(\d\d):(\d\d), loss [\d.]+"
    )
    for line in lines:
        m = re.fullmatch(pattern, line)
        assert m, line
        done, total, rate, examples = int(m[1]), int(m[2]), float(m[3]), int(m[4].replace(",", ""))
        eta = int(m[5]) * 3600 + int(m[6]) * 60 + int(m[7])
        assert total == STEPS
        assert examples == pytest.approx(rate * BATCH * WORLD_SIZE, rel=0.02, abs=1)
        assert eta == pytest.approx((STEPS - done) / rate, abs=1)
    assert lines[-1].startswith(f"train {STEPS:>6}/{STEPS} (100%)") and "ETA 0:00:00" in lines[-1]


def test_table_counters(run):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from dynamicemb import get_sharded_table_capacity

    s, _ = run
    dynamic = {f.table: f for f in train_dlrm.FEATURES if f.dynamic}
    assert set(s["tables"]) == set(dynamic)
    for name, t in s["tables"].items():
        config = EmbeddingBagConfig(
            name=name, num_embeddings=dynamic[name].capacity, embedding_dim=16, feature_names=["f"]
        )
        assert t["capacity"] == WORLD_SIZE * get_sharded_table_capacity(config, WORLD_SIZE, 128), (
            name
        )
        assert 0 < t["rows_held"] <= t["capacity"], name
        assert t["rows_held"] <= t["distinct_ids"], name
        # Every key a table took either filled a free slot or replaced a victim.
        assert t["inserts"] - t["evictions"] == t["rows_held"], name
        assert t["insert_failures"] == 0, name
    item, user = s["tables"]["t_item"], s["tables"]["t_user"]
    # The small table sees far more ids than it holds: it is full and evicts.
    assert item["distinct_ids"] > 4 * item["capacity"]
    assert item["rows_held"] == item["capacity"]
    assert item["evictions"] >= item["distinct_ids"] - item["capacity"]
    # The large one holds every id it saw.
    assert user["evictions"] == 0
    assert user["rows_held"] == user["distinct_ids"]


def test_output(run):
    s, text = run
    assert "plan (2 ranks, cpu):" in text
    assert "t_device static  table_wise / fused" in text
    for name in s["tables"]:
        assert f"{name} " in text and "dynamic row_wise / customized_kernel" in text
    assert f"trained {STEPS} steps of {BATCH} x {WORLD_SIZE} examples" in text
    assert "Traceback" not in text


def test_splitmix64_gives_the_generators_published_outputs():
    # SplitMix64's next() adds the golden gamma to its state, then applies the
    # finalizer: from state 0 its first outputs are these (Vigna, splitmix64.c).
    gamma = 0x9E3779B97F4A7C15
    states = torch.tensor([train_dlrm._wrap(gamma * k) for k in (1, 2, 3)])
    want = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert train_dlrm.splitmix64(states).tolist() == [train_dlrm._wrap(w) for w in want]
