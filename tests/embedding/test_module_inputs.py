"""BatchedDynamicEmbeddingTablesV2, RowOptimizer and the initializer
arguments refuse bad input with an error naming the argument, and a refused
forward changes nothing: not the table, not the value rows, not the step
counter (checked before anything is touched)."""

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
from dynamicemb.embedding.optimizer import RowOptimizer

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
MODULE_STATE = ("keys", "digests", "scores", "counters", "free_rows", "info")


def _module(device, strategy=Score.STEP, pooling=Pool.SUM, tables=1):
    opts = [
        DynamicEmbTableOptions(
            dim=4,
            max_capacity=64,
            bucket_capacity=16,
            score_strategy=strategy,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.1, upper=0.1),
        )
        for _ in range(tables)
    ]
    return BatchedDynamicEmbeddingTablesV2(
        opts, pooling_mode=pooling, optimizer=EmbOptimType.EXACT_SGD, device=device
    )


def _state(m):
    s = {k: getattr(m.rows.hash_table, k).clone().cpu() for k in MODULE_STATE}
    for i, seg in enumerate(m.storage.space()):  # the value rows
        s[f"values{i}"] = seg.clone().cpu()
    s["step"] = m.step
    return s


def _refused(m, exc, match, *args, **kw):
    before = _state(m)
    with pytest.raises(exc, match=match):
        m(*args, **kw)
    after = _state(m)
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, after[k]), f"{k} changed"
        else:
            assert v == after[k], f"{k} changed"


@pytest.mark.parametrize("device", DEVICES)
def test_offsets_not_ending_at_the_number_of_indices_refused_before_any_insert(device):
    # Found: the six keys were inserted and initialized before the pooling op refused.
    m = _module(device)
    _refused(
        m,
        ValueError,
        r"offsets must run from 0 to the number of indices \(6\), got 1 to 7",
        torch.arange(1, 7, device=device),
        torch.tensor([1, 3, 4, 5, 7], device=device),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "offsets, match",
    [
        ([0, 3, 2, 6], r"offsets must not decrease, got 3 then 2 at index 2"),
        ([0, 2, 4, 5], r"offsets must run from 0 to the number of indices \(6\), got 0 to 5"),
        ([1, 2, 4, 6], r"offsets must run from 0 to the number of indices \(6\), got 1 to 6"),
    ],
    ids=["decreasing", "short_end", "nonzero_start"],
)
def test_bad_offsets_raise_value_error_naming_offsets(device, offsets, match):
    m = _module(device)
    idx = torch.arange(1, 7, device=device)
    _refused(m, ValueError, match, idx, torch.tensor(offsets, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_rejected_forward_does_not_advance_the_step_counter(device):
    m = _module(device, strategy=Score.STEP)
    m(torch.tensor([1, 2], device=device), torch.tensor([0, 1, 2], device=device))
    assert m.step == 1
    idx, off = torch.tensor([3], device=device), torch.tensor([0, 2], device=device)
    _refused(m, ValueError, "offsets", idx, off)
    _refused(
        m,
        ValueError,
        r"indices: key -9223372036854775808 at index 1 is reserved",
        torch.tensor([3, -(2**63)], device=device),
        torch.tensor([0, 1, 2], device=device),
    )
    assert m.step == 1


@pytest.mark.parametrize("device", DEVICES)
def test_customized_without_a_score_is_refused_before_the_step_advances(device):
    m = _module(device, strategy=Score.CUSTOMIZED)
    _refused(
        m,
        RuntimeError,
        "set_score",
        torch.tensor([3], device=device),
        torch.tensor([0, 1], device=device),
    )
    with pytest.raises(TypeError, match=r"score must be an int, got 2.5"):
        m.set_score(2.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "what, indices, offsets, exc, match",
    [
        ("float indices", [1.7, 2.0], [0, 1, 2], TypeError, r"indices must be int64 or int32"),
        ("float offsets", [1, 2], [0.0, 1.0, 2.0], TypeError, r"offsets must be int64 or int32"),
        ("bool indices", [True, False], [0, 1, 2], TypeError, r"indices must be"),
        (
            "2-D indices",
            [[1, 2]],
            [0, 1, 2],
            ValueError,
            r"indices must be 1-D, got shape \(1, 2\)",
        ),
        ("2-D offsets", [1, 2], [[0, 1, 2]], ValueError, r"offsets must be 1-D"),
        ("empty offsets", [1, 2], [], ValueError, r"offsets has 0 entries"),
    ],
)
def test_indices_and_offsets_of_a_wrong_kind_are_refused_not_truncated(
    device, what, indices, offsets, exc, match
):
    m = _module(device)
    off = torch.tensor(offsets, device=device)
    if not offsets:
        off = off.long()
    _refused(m, exc, match, torch.tensor(indices, device=device), off)


@pytest.mark.parametrize("device", DEVICES)
def test_int32_indices_and_offsets_are_accepted(device):
    m = _module(device)
    out = m(
        torch.tensor([1, 2], dtype=torch.int32, device=device),
        torch.tensor([0, 1, 2], dtype=torch.int32, device=device),
    )
    assert out.shape == (2, 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "counts, match",
    [
        ([0.5, 1.0], r"frequency_counters must be finite whole numbers >= 0, got 0.5 at index 0"),
        ([1, -2], r"got -2 at index 1"),
        ([1.0, float("nan")], r"got nan at index 1"),
        ([float("inf"), 1.0], r"got inf at index 0"),
    ],
)
def test_frequency_counters_that_are_not_counts_are_refused(device, counts, match):
    m = _module(device, strategy=Score.LFU, pooling=Pool.NONE)
    _refused(
        m,
        ValueError,
        match,
        torch.tensor([5, 6], device=device),
        torch.tensor([0, 1, 2], device=device),
        frequency_counters=torch.tensor(counts, device=device),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_whole_float_frequency_counters_are_counts(device):
    # KJT weights carry the counters of an EmbeddingCollection, as floats.
    m = _module(device, strategy=Score.LFU, pooling=Pool.NONE)
    m(
        torch.tensor([5, 6, 5], device=device),
        torch.tensor([0, 1, 2, 3], device=device),
        frequency_counters=torch.tensor([2.0, 3.0, 4.0], device=device),
    )
    slots = m.rows.hash_table.find(torch.tensor([5, 6], device=device))
    assert m.rows.hash_table.scores[slots, 0].cpu().tolist() == [6, 3]


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_pooling_weights_are_refused(device):
    m = _module(device)
    _refused(
        m,
        ValueError,
        r"pooling_weights must be finite, got nan at index 1",
        torch.tensor([5, 6], device=device),
        torch.tensor([0, 1, 2], device=device),
        pooling_weights=torch.tensor([1.0, float("nan")], device=device),
    )


@pytest.mark.parametrize("name", ["indices", "offsets", "pooling_weights", "frequency_counters"])
def test_meta_inputs_are_refused_naming_the_argument(name):
    m = _module("cpu", strategy=Score.LFU if name == "frequency_counters" else Score.STEP)
    args = {
        "indices": torch.tensor([5, 6]),
        "offsets": torch.tensor([0, 1, 2]),
    }
    if name == "pooling_weights":
        args[name] = torch.ones(2)
    if name == "frequency_counters":
        args[name] = torch.ones(2, dtype=torch.int64)
    args[name] = args[name].to("meta")
    _refused(m, ValueError, rf"{name} is on the meta device", **args)


# ------------------------------------------------------ initializer args --


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(mean=float("nan")), ValueError, r"mean must be finite, got nan"),
        (dict(upper=float("inf")), ValueError, r"upper must be finite, got inf"),
        (dict(lower=float("-inf")), ValueError, r"lower must be finite, got -inf"),
        (dict(std_dev=-1), ValueError, r"std_dev must be at least 0.0, got -1"),
        (dict(std_dev=float("nan")), ValueError, r"std_dev must be finite"),
        (dict(value="x"), TypeError, r"value must be a real number, got 'x'"),
        (dict(mean=None), TypeError, r"mean must be a real number, got None"),
        (dict(value=True), TypeError, r"value must be a real number, got True"),
    ],
)
def test_initializer_args_refuse_non_finite_or_invalid_numbers(kw, exc, match):
    with pytest.raises(exc, match=rf"DynamicEmbInitializerArgs\.{match}"):
        DynamicEmbInitializerArgs(mode=Mode.NORMAL, **kw)


def test_initializer_args_accept_ints_and_finite_floats():
    a = DynamicEmbInitializerArgs(
        mode=Mode.TRUNCATED_NORMAL, mean=1, std_dev=0, lower=-2, upper=3.5
    )
    assert (a.mean, a.std_dev, a.lower, a.upper) == (1, 0, -2, 3.5)


# ------------------------------------------------------------- optimizer --


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(learning_rate="fast"), TypeError, r"learning_rate must be a real number, got 'fast'"),
        (dict(learning_rate=-0.1), ValueError, r"learning_rate must be at least 0.0"),
        (dict(eps=float("nan")), ValueError, r"eps must be finite"),
        (dict(beta1=float("inf")), ValueError, r"beta1 must be finite"),
        (dict(weight_decay_mode=1.5), TypeError, r"weight_decay_mode must be an int, got 1.5"),
    ],
)
def test_optimizer_hyper_parameters_are_checked_by_name(kw, exc, match):
    with pytest.raises(exc, match=match):
        RowOptimizer(EmbOptimType.EXACT_SGD, **kw)
    opts = [DynamicEmbTableOptions(dim=4, max_capacity=64, bucket_capacity=16)]
    with pytest.raises(exc, match=match):
        BatchedDynamicEmbeddingTablesV2(opts, optimizer=EmbOptimType.EXACT_SGD, **kw)
