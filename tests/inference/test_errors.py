"""Bad input to an inference table gets an error naming the bad value, and
changes nothing: an unknown dtype, a checkpoint of another dim or without
the table, ids and offsets of the wrong dtype or shape, weights where the
pooling takes none, a KJT without a feature, a row the format cannot store.
A delta built by hand (no sequence) applies and leaves the position."""

import pytest
import torch

from dynamicemb import DynamicEmbPoolingMode as P
from dynamicemb.checkpoint import CheckpointError
from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
from dynamicemb.replication import DeltaDumpResult
from tests.checkpoint import ckpt_harness as c


def _table(**kw):
    configs = [InferenceTableConfig("a", 4), InferenceTableConfig("b", 4, ["b1", "b2"])]
    return InferenceEmbeddingTable(configs, **kw)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, "int4", torch.uint8, torch.qint8])
def test_an_unknown_row_dtype_is_refused(dtype):
    with pytest.raises(ValueError, match="unknown row dtype .*float32, float16, bfloat16"):
        _table(dtype=dtype)


@pytest.mark.parametrize(
    "configs, match",
    [
        ([], "at least one table"),
        ([InferenceTableConfig("a", 0)], "dim must be a positive int"),
        ([InferenceTableConfig("a", 4), InferenceTableConfig("a", 4)], "named twice"),
        ([InferenceTableConfig("a", 4), InferenceTableConfig("b", 4, ["a"])], "feature is named"),
        ([InferenceTableConfig("a", 4, default="ones")], "default must be 'zeros'"),
    ],
)
def test_bad_table_configs_are_refused(configs, match):
    with pytest.raises(ValueError, match=match):
        InferenceEmbeddingTable(configs)


def test_sequence_lookups_need_one_dim_and_spare_room_is_a_fraction():
    configs = [InferenceTableConfig("a", 4), InferenceTableConfig("b", 8)]
    with pytest.raises(ValueError, match="pooling NONE needs one dim"):
        InferenceEmbeddingTable(configs, pooling=P.NONE)
    with pytest.raises(ValueError, match="spare must be a fraction"):
        InferenceEmbeddingTable(configs, spare=-1)


def test_bad_ids_offsets_and_weights_are_refused():
    table = _table()
    ids, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2, 3])
    for bad, err, match in (
        (ids.float(), TypeError, "ids must be int64 or int32, got torch.float32"),
        (ids.to(torch.uint8), TypeError, "ids must be int64 or int32, got torch.uint8"),
        (ids[None], ValueError, "ids must be a 1-D tensor"),
    ):
        with pytest.raises(err, match=match):
            table(bad, offsets)
    with pytest.raises(TypeError, match="offsets must be int64 or int32"):
        table(ids, offsets.double())
    with pytest.raises(ValueError, match="offsets must have F \\* B \\+ 1 entries for the 3"):
        table(ids, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="ids need their offsets"):
        table(ids)
    with pytest.raises(TypeError, match="per_sample_weights must be a floating tensor"):
        table(ids, offsets, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="per_sample_weights have shape"):
        table(ids, offsets, torch.ones(4))
    with pytest.raises(ValueError, match="per_sample_weights need pooling SUM"):
        _table(pooling=P.MEAN)(ids, offsets, torch.ones(3))
    assert torch.equal(table(ids.int(), offsets.int()), torch.zeros(1, 12))


def test_a_keyed_jagged_tensor_without_a_feature_is_refused():
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(
        keys=["a", "b1"], values=torch.tensor([1, 2]), lengths=torch.ones(2, dtype=torch.int64)
    )
    with pytest.raises(ValueError, match=r"has no feature \['b2'\]"):
        _table()(kjt)
    with pytest.raises(ValueError, match="carries its offsets"):
        _table()(kjt, torch.tensor([0, 1]))


def test_checkpoints_of_another_dim_or_without_the_table_are_refused(job, tmp_path):
    _, path, _ = job
    with pytest.raises(
        ValueError, match="embedding_dim 8 differs from the inference table's dim 6"
    ):
        InferenceEmbeddingTable.from_checkpoint(path, [InferenceTableConfig("t0", 6)])
    with pytest.raises(ValueError, match="has no table 'nope'"):
        InferenceEmbeddingTable.from_checkpoint(path, ["nope"])
    with pytest.raises(ValueError, match="has no table 't0' in 'other'"):
        InferenceEmbeddingTable.from_checkpoint(
            path, [InferenceTableConfig("t0", collection="other")]
        )
    with pytest.raises(CheckpointError, match="no dynamicemb checkpoint"):
        InferenceEmbeddingTable.from_checkpoint(str(tmp_path / "missing"))
    # A load that fails leaves the table as it was.
    table = InferenceEmbeddingTable.from_checkpoint(path, ["t0", "t2"])
    before = table._state
    table.tables[1] = InferenceTableConfig("t2", 4, ["t2"], collection="elsewhere")
    with pytest.raises(ValueError, match="has no table 't2' in 'elsewhere'"):
        table.load_checkpoint(path)
    assert table._state is before


def test_a_checkpoint_read_whole_names_every_table_of_it(job):
    cs, path, rows = job
    table = InferenceEmbeddingTable.from_checkpoint(path)
    assert [t.name for t in table.tables] == [t.name for t in cs.tables]
    assert [t.collection for t in table.tables] == [c.COLLECTION] * 3
    assert table.feature_names == [t.name for t in cs.tables]
    assert table.sizes() == {n: r["keys"].numel() for n, r in rows.items()}


def _delta(keys, values, erased=None):
    from dynamicemb import DynamicEmbTableOptions

    d = DeltaDumpResult()
    d.append(
        {
            "table_names": "a",
            "keys": keys,
            "values": values,
            "optimizer_states": None,
            "scores": torch.zeros(keys.numel(), 1, dtype=torch.int64),
            "erased_keys": erased,
            "evicted_keys": torch.empty(0, dtype=torch.int64),
            "meta": {"num_scores": 1, "table_options": DynamicEmbTableOptions(dim=4)},
        }
    )
    return {"model.c": d}


@pytest.mark.parametrize("dtype", [torch.float16, torch.int8, torch.float8_e4m3fn])
def test_a_row_the_format_cannot_store_is_refused_naming_the_key(dtype):
    table = _table(dtype=dtype)
    big = 1e6 if dtype == torch.float16 else float("nan")
    values = torch.ones(2, 4, dtype=torch.float32)
    values[1, 2] = big
    before = table._state
    with pytest.raises(ValueError, match="the row of key 9 cannot be stored as"):
        table.apply_delta(_delta(torch.tensor([8, 9]), values))
    assert table._state is before


def test_a_delta_built_by_hand_applies_and_erases_without_moving_the_position():
    table = _table(dtype=torch.float32)
    values = torch.arange(12, dtype=torch.float32).view(3, 4)
    stats = table.apply_delta(_delta(torch.tensor([5, 6, 7]), values))
    assert stats["model.c"]["a"].upserted == 3
    assert table.stream_position() == (None, None)
    assert torch.equal(
        table.rows("a", torch.tensor([7, 5, 4])),
        values[[2, 0]].new_tensor([[8, 9, 10, 11], [0, 1, 2, 3], [0, 0, 0, 0]]),
    )
    stats = table.apply_delta(_delta(torch.tensor([7]), values[:1] + 1, torch.tensor([5, 99])))
    assert stats["model.c"]["a"].erased == 1
    assert table.sizes() == {"a": 2, "b": 0}
    assert torch.equal(
        table.rows("a", torch.tensor([5, 6, 7])),
        torch.tensor([[0.0, 0, 0, 0], [4, 5, 6, 7], [1, 2, 3, 4]]),
    )
    with pytest.raises(ValueError, match="the delta holds a key twice"):
        table.apply_delta(_delta(torch.tensor([1, 1]), values[:2]))
    with pytest.raises(ValueError, match="deltas must be a dict"):
        table.apply_delta([1])
