"""The sharded benchmark (tools/bench/sharded_ec_bench.py) end to end on the
CPU at a tiny size: two gloo ranks, TorchRec's static plans, its
managed-collision tables and the dynamic tables, ids beyond the rows."""

import json
import math

from tests.bench.bench_run import run, table_rows

ROWS, ID_SPACE, TABLES = 500, 2000, 2
WARMUP, STEPS, PIPELINED_ROUNDS = 1, 2, 3


def test_every_version_gets_a_row_and_new_batches(tmp_path):
    path = tmp_path / "out.json"
    out = run(
        "sharded_ec_bench.py",
        *("--device", "cpu", "--world-size", "2", "--collection", "ec", "--batch", "64"),
        *("--tables", str(TABLES), "--features", str(TABLES), "--hotness", "1", "--dim", "8"),
        *("--rows", str(ROWS), "--id-space", str(ID_SPACE), "--optimizer", "sgd"),
        *("--plans", "table_wise", "--mc", "mch", "zch"),
        *("--warmup", str(WARMUP), "--steps", str(STEPS), "--json", str(path)),
    )
    rows = {cells[1]: cells for cells in table_rows(out, "sgd")}
    assert list(rows) == [
        "torchrec:table_wise",
        "torchrec:mch",
        "torchrec:zch",
        "dynamicemb",
    ], out[-3000:]
    # FBGEMM's CPU kernel of the zero-collision hash only looks ids up.
    assert rows["torchrec:zch"][2].startswith("n/a (FBGEMM's CPU kernel"), rows["torchrec:zch"]
    for which, cells in rows.items():
        if which == "torchrec:zch":
            continue
        step, host, pipelined = (float(c) for c in cells[3:6])
        assert all(math.isfinite(t) and t > 0 for t in (step, host, pipelined)), cells
    # The ratios to what a user would pick, with bounded ids and with unbounded ones.
    summary = next(line for line in out.splitlines() if line.startswith("* sgd:"))
    assert "dynamicemb / torchrec:" in summary and "dynamicemb / torchrec:mch" in summary, summary

    results = {r["which"]: r for r in json.loads(path.read_text())["results"]}
    # One step after building, the warm-up and timed steps, the pipelined rounds:
    # each on a batch the version had not trained on (the benchmark refuses a repeat).
    batches = 1 + WARMUP + STEPS + PIPELINED_ROUNDS * STEPS
    for which, r in results.items():
        assert r.get("batches", batches) == batches, (which, r)
    # The managed-collision tables hold at most their rows, the ids ranging beyond them.
    assert 0 < results["torchrec:mch"]["rows_held"] <= TABLES * ROWS
    assert results["dynamicemb"]["rows_held"] > 0
    assert results["dynamicemb"]["insert_failures"] == 0
