"""The storage benchmarks run, at a tiny size on the CPU, so that they keep
running: the one through DistributedModelParallel (every configuration a
row, TorchRec's CPU-less ones n/a), the module-level one, the cache's
per-stage profile, the train step with rows in another dtype against float32
and the comparison of the two FP8 formats. They run one after another in one
new process (torch, TorchRec and dynamicemb imported once), each test reading
its benchmark's output."""

import re

import pytest
import torch

from tests.bench.bench_run import run_each

CALLS = {
    "dmp": (
        "storage_dmp_bench.py",
        *("--device", "cpu", "--tables", "2", "--rows", "3000", "--dim", "8", "--batch", "48"),
        *("--warmup", "1", "--steps", "2", "--budgets", "0.1", "0.5", "--prefetch-budgets", "0.1"),
        *("--kinds", "ebc", "ec", "--optimizers", "sgd", "adam", "--profile-steps", "1"),
        *("--fill", "0"),  # one warm-up batch: the fill is the next call's
    ),
    "dmp-fill": (
        "storage_dmp_bench.py",
        *("--device", "cpu", "--tables", "1", "--rows", "3000", "--dim", "8", "--batch", "48"),
        *("--warmup", "1", "--steps", "2", "--budgets", "0.1", "--kinds", "ebc"),
        *("--optimizers", "sgd", "--configs", "dynamic_hbm", "cache"),
    ),
    **{
        f"module-{optimizer}": (
            "storage_bench.py",
            *("--device", "cpu", "--tables", "1", "--rows", "3000", "--dim", "8"),
            *("--lookups", "128", "--optimizer", optimizer, "--ratios", "0.5"),
            *("--steps", "2", "--warmup", "1"),
        )
        for optimizer in ("sgd", "adam")
    },
    "stages": (
        "storage_stages.py",
        *("--device", "cpu", "--tables", "2", "--rows", "1280", "--dim", "8"),
        *("--lookups", "64", "--warmup", "2", "--steps", "2", "--timed", "2"),
    ),
    "dtype": (
        "embedding_bench.py",
        *("--device", "cpu", "--tables", "2", "--lookups", "128", "--rows", "3000"),
        *("--dim", "8", "--reps", "2", "--embedding-dtype", "float8_e4m3fn"),
    ),
    "fp8": ("fp8_formats.py", "--seeds", "1", "--dim", "16"),
}


@pytest.fixture(scope="module")
def outputs():
    return run_each(CALLS)


def test_the_dmp_benchmark_prints_a_row_per_configuration(outputs):
    out = outputs["dmp"]
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| ebc", "| ec"))]
    # --profile-steps: a summary for every row that ran outside the prefetch pipeline.
    profiled = [line for line in out.splitlines() if "per step (under the profiler)" in line]
    ran = [c for c in rows if c[4] != "n/a" and not c[2].endswith("_prefetch")]
    assert len(profiled) == len(ran) > 0, out[-3000:]
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "per step (under the profiler)" in line and " torchrec_" not in line:
            # A dynamic table's step: its own ranges are among the host's operators.
            assert "dynamicemb:" in lines[i + 2], lines[i : i + 3]
    # 2 kinds x 2 optimizers x (2 all-HBM + 3 x 2 budgets + 2 prefetch rows)
    assert len(rows) == 2 * 2 * 10
    # The all-HBM dynamic step timed again after its group: the faster of the
    # two is the row's step.
    again = re.findall(r"^(\w+) (\w+) dynamic_hbm again: ([\d.]+) ms \(first ([\d.]+);", out, re.M)
    assert len(again) == 4, out[-3000:]
    for kind, optimizer, second, first in again:
        (row,) = [c for c in rows if c[0][2:] == kind and c[1:3] == [optimizer, "dynamic_hbm"]]
        assert row[4] == f"{min(float(first), float(second)):.2f}", (row, first, second)
    for cells in rows:
        kind, optimizer, config, step = cells[0][2:], cells[1], cells[2], cells[4]
        cpu_less = config.endswith("_prefetch") or config == "torchrec_uvm"
        if cpu_less or (config == "torchrec_hbm" and optimizer == "adam"):
            assert step == "n/a", cells
            continue
        assert float(step) > 0, cells
        if not config.startswith("torchrec"):
            assert float(cells[5]) > 0 and cells[7] != "-", cells  # / all-HBM, moved
        assert kind in ("ebc", "ec")


def test_the_dmp_benchmark_warms_up_until_the_cache_is_full(outputs):
    """The warm-up lasts until its batches hold 1.2 times the rows the cache
    keeps (--fill's default; 10 % of 3,000 rows), counted here from the same
    draws (the power law's ranks; the benchmark scatters them by a bijection,
    which keeps their count) with a set; the full cache then evicts in the
    timed steps: it writes rows back to host memory."""
    out = outputs["dmp-fill"]
    m = re.search(r"median of 2 steps after (\d+) \(holding ([\d,]+)\+ distinct rows", out)
    assert m, out[-3000:]
    warm, target = int(m.group(1)), int(m.group(2).replace(",", ""))
    assert target == int(1.2 * 0.1 * 3000)
    g = torch.Generator().manual_seed(0)
    a = 1.0 - 1.05
    seen, batches = set(), 0
    while len(seen) < target:
        u = torch.rand(48, generator=g, dtype=torch.float64)
        seen.update((((3000**a - 1.0) * u + 1.0) ** (1.0 / a)).long().clamp(1, 3000).tolist())
        batches += 1
    assert warm == batches > 1, out[-3000:]
    cache = [c.split(" | ") for c in out.splitlines() if c.startswith("| ebc | sgd | cache |")]
    assert len(cache) == 1 and float(cache[0][7]) > 0, out[-3000:]  # moved MB/step


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_module_benchmark_runs(outputs, optimizer):
    out = outputs[f"module-{optimizer}"]
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 4  # the head, all-device, hybrid, the cache without and with prefetch


def test_the_stage_profile_prints_the_cache_stages(outputs):
    out = outputs["stages"]
    for stage in ("cache_insert", "cache_backing", "cache_fill", "cache_overflow", "update"):
        assert f"dynamicemb:{stage}" in out, out[-3000:]
    assert "dynamicemb:cache_write_back" in out, out[-3000:]
    # The prefetch's stages, in the profile of the steps that prefetch.
    for stage in ("prefetch_find", "prefetch_insert", "prefetch_write_back", "prefetch_fill"):
        assert f"dynamicemb:{stage}" in out, out[-3000:]
    # Every profiled step of that variant prefetches once (and trains a batch
    # the step before prefetched).
    finds = [line for line in out.splitlines() if "dynamicemb:prefetch_find" in line]
    assert finds and all(line.endswith("calls 1.0") for line in finds), finds
    # Warmed up until the cache is full (1.2 times its 128 rows a table).
    m = re.search(r"== warm-up: \d+ new batches, ([\d,]+)\+ distinct rows a table", out)
    assert m and int(m.group(1).replace(",", "")) >= int(1.2 * 0.1 * 1280), out[-3000:]
    # The step of each variant: victims staged or written at once, with and
    # without prefetch.
    steps = [line for line in out.splitlines() if "ms/step" in line]
    assert len(steps) == 4, out[-3000:]


def test_the_step_in_another_dtype_is_timed_against_float32(outputs):
    out = outputs["dtype"]
    assert "| BatchedDynamicEmbeddingTablesV2, rows in float8_e4m3fn | " in out, out[-3000:]
    assert "rows in float8_e4m3fn against float32: step time " in out, out[-3000:]
    assert "(row bytes 12 against 32)" in out  # SGD, dim 8: pad4(8) + 4 against 8 * 4


def test_the_fp8_formats_are_compared(outputs):
    out = outputs["fp8"]
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    # Two heads, two kinds of rows, 2 learning rates x 3 dtypes.
    assert len(rows) == 2 + 2 + 6, out[-3000:]
