"""The production-shaped benchmark (tools/bench/dlrm_bench.py) end to end on
the CPU at a tiny size: the main job's --preset criteo model with dynamic
tables and with TorchRec's static ones, each reporting finite examples/s,
both trained on the same new batches in the same order."""

import json
import math
import statistics

from tests.bench.bench_run import run, table_rows

WARMUP, STEPS, ROUNDS, BATCH = 1, 2, 2, 32


def test_dynamic_and_static_on_the_same_new_batches(tmp_path):
    path = tmp_path / "out.json"
    out = run(
        "dlrm_bench.py",
        *("--warmup", str(WARMUP), "--steps", str(STEPS), "--rounds", str(ROUNDS)),
        *("--preset", "criteo", "--interaction", "dcn", "--emb-budget-gib", "0.01"),
        *("--device", "cpu", "--world-size", "1", "--batch-size", str(BATCH), "--dim", "8"),
        *("--json", str(path)),
    )
    # The static model is TorchRec's own tables and kernel.
    assert any(line.startswith("static: ") and "/fused" in line for line in out.splitlines())
    for model in ("dynamic", "static"):
        (cells,) = table_rows(out, model)
        examples_per_s, ms = float(cells[2].replace(",", "")), float(cells[3])
        assert math.isfinite(examples_per_s) and examples_per_s > 0, cells
        assert math.isfinite(ms) and ms > 0, cells

    r = json.loads(path.read_text())
    n = WARMUP + ROUNDS * STEPS
    dynamic, static = r["dynamic"]["batches"], r["static"]["batches"]
    assert len(dynamic) == n and dynamic == static and r["same_batches"] is True
    assert len(set(dynamic)) == n  # every step on a batch not seen before
    for model in ("dynamic", "static"):
        seconds = r[model]["round_seconds"]
        assert len(seconds) == ROUNDS and all(s > 0 for s in seconds), r[model]
        want = BATCH * STEPS / statistics.median(seconds)
        assert math.isclose(r[model]["examples_per_s"], want, rel_tol=1e-9), r[model]
    assert math.isclose(r["ratio"], r["dynamic"]["examples_per_s"] / r["static"]["examples_per_s"])
    # The dynamic tables took the batches' ids: one id a feature and example.
    tables = r["dynamic_tables"]
    assert 0 < tables["rows_held"] <= 26 * BATCH * n and tables["insert_failures"] == 0
