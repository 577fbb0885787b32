"""score_function of the compound (TIMESTAMP, LFU) strategy: the key with the
lowest returned score leaves a full bucket, NaN first, identically for both
tuple orders; refused with any other strategy."""

import math

import pytest
import torch

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbTableOptions,
)
from dynamicemb import (
    DynamicEmbInitializerMode as Mode,
)
from dynamicemb import (
    DynamicEmbPoolingMode as Pool,
)
from dynamicemb import (
    DynamicEmbScoreStrategy as Score,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from tests.devices import DEVICES

pytest.importorskip("numba")
EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType
TS_LFU = (Score.TIMESTAMP, Score.LFU)
LFU_TS = (Score.LFU, Score.TIMESTAMP)


# The same rankings written for each tuple order (scores follow the tuple).
def oldest_first_ts_lfu(scores, cur_timestamp):
    return -(cur_timestamp - scores[0])


def oldest_first_lfu_ts(scores, cur_timestamp):
    return -(cur_timestamp - scores[1])


def decayed_ts_lfu(scores, cur_timestamp):
    age_seconds = (cur_timestamp - scores[0]) * 1e-9
    return math.log(max(scores[1], 1)) + age_seconds * math.log(0.9)


def decayed_lfu_ts(scores, cur_timestamp):
    age_seconds = (cur_timestamp - scores[1]) * 1e-9
    return math.log(max(scores[0], 1)) + age_seconds * math.log(0.9)


def nan_for_frequency_3_ts_lfu(scores, cur_timestamp):
    if scores[1] == 3:
        return math.nan
    return -math.inf


def nan_for_frequency_3_lfu_ts(scores, cur_timestamp):
    if scores[0] == 3:
        return math.nan
    return -math.inf


ORDERS = {
    "ts_lfu": (TS_LFU, oldest_first_ts_lfu, decayed_ts_lfu, nan_for_frequency_3_ts_lfu),
    "lfu_ts": (LFU_TS, oldest_first_lfu_ts, decayed_lfu_ts, nan_for_frequency_3_lfu_ts),
}


def _module(strategy, fn, device, capacity=16, dim=2):
    opts = [
        DynamicEmbTableOptions(
            dim=dim,
            max_capacity=capacity,
            bucket_capacity=16,
            score_strategy=strategy,
            score_function=fn,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.1, upper=0.1),
        )
    ]
    return BatchedDynamicEmbeddingTablesV2(
        opts, None, Pool.SUM, EmbOptimType.EXACT_SGD, device=device
    )


def _fill(m, frequencies, device):
    """Key k enters at step k (so older keys have smaller timestamps) with
    access count frequencies[k]; 16 keys fill the one 16-slot bucket."""
    for k, f in enumerate(frequencies):
        m(
            torch.tensor([k], device=device),
            torch.tensor([0, 1], device=device),
            frequency_counters=torch.tensor([f], device=device),
        )
    assert int(m.rows.hash_table.size()[0]) == len(frequencies)


def _resident(m, keys, device):
    return [
        k for k in keys if int(m.rows.hash_table.find(torch.tensor([k], device=device))[0]) >= 0
    ]


# Key 0 is the oldest and the most used, key 7 the least used.
FREQ = [100 if k == 0 else 1 if k == 7 else 5 for k in range(16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_the_function_picks_its_own_victim_not_the_default_one(device, order):
    strategy, oldest_first, _, _ = ORDERS[order]
    default, custom = _module(strategy, None, device), _module(strategy, oldest_first, device)
    for m in (default, custom):
        _fill(m, FREQ, device)
        m(torch.tensor([99], device=device), torch.tensor([0, 1], device=device))
    # The default evictor takes the least frequent key, the function the oldest.
    assert set(range(16)) - set(_resident(default, range(16), device)) == {7}
    assert set(range(16)) - set(_resident(custom, range(16), device)) == {0}
    assert _resident(custom, [99], device) == [99]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_one_batch_evicts_the_lowest_scores_in_order(device, order):
    strategy, oldest_first, _, _ = ORDERS[order]
    default, custom = _module(strategy, None, device), _module(strategy, oldest_first, device)
    new = torch.tensor([97, 98, 99], device=device)
    for m in (default, custom):
        _fill(m, FREQ, device)
        m(new, torch.tensor([0, 3], device=device))
        assert _resident(m, [97, 98, 99], device) == [97, 98, 99]  # new keys are never victims
    assert set(range(16)) - set(_resident(default, range(16), device)) == {7, 1, 2}
    assert set(range(16)) - set(_resident(custom, range(16), device)) == {0, 1, 2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_nan_is_evicted_first_even_before_minus_infinity(device, order):
    strategy, _, _, nan_for_3 = ORDERS[order]
    default, m = _module(strategy, None, device), _module(strategy, nan_for_3, device)
    # Key 11 (the most used) scores NaN, every other key -inf.
    freq = [3 if k == 11 else 1 + k % 2 for k in range(16)]
    for x in (default, m):
        _fill(x, freq, device)
        x(torch.tensor([99], device=device), torch.tensor([0, 1], device=device))
    assert set(range(16)) - set(_resident(m, range(16), device)) == {11}
    assert set(range(16)) - set(_resident(default, range(16), device)) == {0}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["oldest_first", "decayed"])
def test_both_tuple_orders_evict_identically(device, kind):
    i = 1 if kind == "oldest_first" else 2
    a = _module(TS_LFU, ORDERS["ts_lfu"][i], device, capacity=64)
    b = _module(LFU_TS, ORDERS["lfu_ts"][i], device, capacity=64)
    plain = _module(TS_LFU, None, device, capacity=64)
    g = torch.Generator().manual_seed(5)
    differs = False
    for step in range(30):
        n = int(torch.randint(4, 12, (1,), generator=g))
        keys = torch.randint(0, 300, (n,), generator=g)
        counts = torch.randint(1, 4, (n,), generator=g)
        for m in (a, b, plain):
            m(
                keys.to(device),
                torch.tensor([0, n], device=device),
                frequency_counters=counts.to(device),
            )
        ka, kb = (set(m.rows.hash_table.export_batch().compact().keys.tolist()) for m in (a, b))
        assert ka == kb, step
        differs |= ka != set(plain.rows.hash_table.export_batch().compact().keys.tolist())
    assert (
        int(a.rows.hash_table.counter("EVICTIONS")[0])
        == int(b.rows.hash_table.counter("EVICTIONS")[0])
        > 0
    )
    if kind == "oldest_first":
        assert differs  # and not what the default evictor keeps


def test_default_compound_evictor_is_frequency_then_older_timestamp():
    m = _module(LFU_TS, None, "cpu")
    _fill(m, [5] * 16, "cpu")  # all tie on frequency: the oldest goes
    m(torch.tensor([99]), torch.tensor([0, 1]))
    assert set(range(16)) - set(_resident(m, range(16), "cpu")) == {0}


@pytest.mark.parametrize(
    "strategy",
    [Score.TIMESTAMP, Score.STEP, Score.CUSTOMIZED, Score.LFU, Score.NO_EVICTION, (Score.LFU,)],
)
def test_score_function_with_another_strategy_is_refused(strategy):
    name = getattr(strategy, "name", None) or strategy[0].name
    with pytest.raises(ValueError, match=f"score_function.*{name}"):
        DynamicEmbTableOptions(
            dim=2, max_capacity=16, score_strategy=strategy, score_function=oldest_first_ts_lfu
        )


def test_module_refuses_a_score_function_whose_strategy_was_changed():
    opts = DynamicEmbTableOptions(
        dim=2, max_capacity=16, score_strategy=TS_LFU, score_function=oldest_first_ts_lfu
    )
    opts.score_strategy = Score.LFU  # dataclass fields can be reassigned after validation
    with pytest.raises(ValueError, match="score_function.*LFU"):
        BatchedDynamicEmbeddingTablesV2([opts])


def test_tables_fused_with_different_score_functions_are_refused():
    opts = [
        DynamicEmbTableOptions(dim=2, max_capacity=16, score_strategy=TS_LFU, score_function=f)
        for f in (oldest_first_ts_lfu, decayed_ts_lfu)
    ]
    with pytest.raises(ValueError, match="share one score_function"):
        BatchedDynamicEmbeddingTablesV2(opts)


def test_a_function_numba_cannot_compile_is_refused_when_the_module_is_built():
    def uses_a_dict(scores, cur_timestamp):
        return {"a": object()}["a"]

    opts = [
        DynamicEmbTableOptions(
            dim=2, max_capacity=16, score_strategy=TS_LFU, score_function=uses_a_dict
        )
    ]
    with pytest.raises(ValueError, match="score_function uses_a_dict cannot be compiled"):
        BatchedDynamicEmbeddingTablesV2(opts)


def test_a_numba_compiled_function_is_accepted():
    numba = pytest.importorskip("numba")
    m = _module(TS_LFU, numba.njit(oldest_first_ts_lfu), "cpu")
    _fill(m, FREQ, "cpu")
    m(torch.tensor([99]), torch.tensor([0, 1]))
    assert set(range(16)) - set(_resident(m, range(16), "cpu")) == {0}


_SIMULATED = r"""
import math
import numpy as np
from dynamicemb.storage.score_function import _cpu_kernel, _cuda_kernel

def fn(scores, cur_timestamp):
    age = (cur_timestamp - scores[0]) * 1e-9
    if scores[1] == 7:
        return math.nan
    return math.log(max(scores[1], 1)) + age * math.log(0.9)

rng = np.random.default_rng(0)
scores = np.stack([rng.integers(0, 10, 96), rng.integers(0, 10**9, 96)], 1).astype(np.int64)
starts = np.array([32, -1, 0, 64], dtype=np.int64)
widths = np.array([32, 16, 16, 32], dtype=np.int64)
now = np.array([2 * 10**9], dtype=np.int64)
for timestamp_first in (True, False):
    got = np.full(96, -5.0)
    want = np.full(96, -5.0)
    _cuda_kernel(fn, timestamp_first)[starts.size, 128](scores, starts, widths, now, got)
    _cpu_kernel(fn, timestamp_first)(scores, starts, widths, now, want)
    assert np.array_equal(got, want, equal_nan=True), timestamp_first
    assert np.all(got[16:32] == -5.0)  # outside the buckets: untouched
print("same")
"""


def test_the_cuda_kernel_computes_what_the_cpu_kernel_does_in_numbas_simulator():
    """The GPU kernel's indexing and column order, run by numba's CUDA
    simulator (the real device run is the gpu-marked tests above)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    out = subprocess.run(
        [sys.executable, "-c", _SIMULATED], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("same")
