"""refuse_cold_keys: a new key colder than its full bucket's lowest is not
inserted; in the training step it reads the rejected-row initializer's row, is
not trained and is counted (REFUSALS); off, the newcomer evicts. The table's
rule itself is checked against the model (tests/table/test_table_model.py)."""

import pytest
import torch

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage.stats import StatCol
from tests.devices import DEVICES

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType
S = DynamicEmbScoreStrategy
WIDTH = 16  # one bucket: every key competes with every other
DIM = 4
INIT = 0.25


def _module(device, refuse, strategy=S.LFU, admit=None):
    opts = [
        DynamicEmbTableOptions(
            dim=DIM,
            max_capacity=WIDTH,
            bucket_capacity=WIDTH,
            score_strategy=strategy,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.CONSTANT, value=INIT),
            refuse_cold_keys=refuse,
            admit_strategy=admit,
            local_hbm_for_values=1 << 20,
        )
    ]
    return BatchedDynamicEmbeddingTablesV2(
        opts, None, Pool.NONE, EmbOptimType.EXACT_SGD, device=device, learning_rate=1.0
    )


def _step(m, keys, device):
    keys = torch.tensor(keys, device=device)
    out = m(keys, torch.tensor([0, keys.numel()], device=device))
    out.sum().backward()  # each row found or inserted moves by -1 per occurrence
    return out.detach().cpu()


def _held(m, device):
    keys = torch.arange(100, 140, device=device)
    return set(keys[m.storage.contains(keys, torch.zeros_like(keys))].tolist())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("refuse", [False, True])
def test_a_colder_newcomer_is_refused_and_reads_the_initializer(device, refuse):
    m = _module(device, refuse)
    residents = list(range(100, 100 + WIDTH))
    _step(m, residents + residents, device)  # frequency 2 each: the bucket is full
    newcomers = [120, 121, 122, 122, 122]  # frequency 1, 1 and 3
    out = _step(m, newcomers, device)
    held = _held(m, device)
    stats = m.stats.counts[0].cpu()
    if refuse:
        # 120 and 121 are colder than every resident: not stored, no victim.
        assert 120 not in held and 121 not in held
        assert len(held & set(residents)) == WIDTH - 1
        assert int(stats[StatCol.REFUSALS]) == 2
        # They read the initializer, as admission's rejected keys do.
        assert torch.equal(out[:2], torch.full((2, DIM), INIT))
        # Not trained: a second lookup refuses and reads the same row again.
        again = _step(m, [120], device)
        assert torch.equal(again, torch.full((1, DIM), INIT))
        assert int(m.stats.counts[0, StatCol.REFUSALS]) == 3
    else:
        assert {120, 121, 122} <= held
        assert StatCol.REFUSALS not in m.stats.fed
    # 122, seen three times, is warmer than the residents (2): it evicts one.
    assert 122 in held
    assert int(m.rows.hash_table.counter("INSERT_FAILURES")[0]) == 0
    assert len(held) == WIDTH


@pytest.mark.parametrize("device", DEVICES)
def test_timestamp_and_step_newcomers_are_never_colder(device):
    for strategy in (S.TIMESTAMP, S.STEP):
        m = _module(device, True, strategy)
        _step(m, list(range(100, 100 + WIDTH)), device)
        _step(m, [130, 131], device)
        assert {130, 131} <= _held(m, device)
        assert int(m.stats.counts[0, StatCol.REFUSALS]) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_with_admission_refused_keys_read_the_strategys_initializer(device):
    rejected_value = -0.5
    admit = FrequencyAdmissionStrategy(
        threshold=1,
        counter=KVCounter(capacity=256, bucket_capacity=128),
        initializer_args=DynamicEmbInitializerArgs(mode=Mode.CONSTANT, value=rejected_value),
    )
    m = _module(device, True, admit=admit)
    residents = list(range(100, 100 + WIDTH))
    _step(m, residents + residents, device)
    out = _step(m, [125], device)  # admitted (threshold 1), then refused by the table
    assert torch.equal(out, torch.full((1, DIM), rejected_value))
    assert 125 not in _held(m, device)
    counts = m.stats.counts[0].cpu()
    assert int(counts[StatCol.REFUSALS]) == 1 and int(counts[StatCol.ADMISSIONS]) >= 1


@pytest.mark.parametrize(
    "kw,what",
    [
        (dict(caching=True), "caching=True"),
        (dict(score_strategy=S.NO_EVICTION), "NO_EVICTION"),
        (
            dict(score_strategy=(S.TIMESTAMP, S.LFU), score_function=lambda s, t: s[1]),
            "score_function",
        ),
    ],
)
def test_refuse_cold_keys_is_refused_where_it_cannot_apply(kw, what):
    with pytest.raises(ValueError, match=f"refuse_cold_keys is not supported with .*{what}"):
        DynamicEmbTableOptions(refuse_cold_keys=True, **kw)


def test_refuse_cold_keys_must_be_a_bool():
    with pytest.raises(TypeError, match="refuse_cold_keys must be a bool, got 1"):
        DynamicEmbTableOptions(refuse_cold_keys=1)


@pytest.mark.gpu
def test_cuda_refuses_the_keys_the_cpu_refuses():
    keys_seq = [list(range(100, 116)) * 2, [120, 121, 122, 122, 122, 101], [121, 123, 100]]
    got = {}
    for device in ("cpu", "cuda"):
        m = _module(device, True)
        outs = [_step(m, k, device) for k in keys_seq]
        got[device] = (outs, sorted(_held(m, device)), m.stats.counts.cpu())
    for a, b in zip(got["cpu"][0], got["cuda"][0]):
        assert torch.equal(a, b)
    assert got["cpu"][1] == got["cuda"][1]
    assert torch.equal(got["cpu"][2], got["cuda"][2])
