"""What the storage allocates, against what the planner and
``get_table_value_bytes`` say it allocates, for every mode and dtype.

The runtime side is measured from the tensors the storage holds; the planner
side computed from the table's options alone.
"""

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import DataType, EmbeddingConfig

from dynamicemb import (
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.planner.prepare import dynamic_shard_storage, prepare_table_options
from dynamicemb.storage import CachedStorage
from dynamicemb.types import MemoryType
from tests.devices import DEVICES
from tests.storage.storage_cases import module, table_options

_DATA_TYPES = {
    torch.float32: DataType.FP32,
    torch.float16: DataType.FP16,
    torch.bfloat16: DataType.BF16,
}


def _tensor_bytes(m, memory) -> int:
    """Bytes of the storage's tensors by where they are, counted from the
    tensors themselves (a mapped host segment counts as host memory)."""
    s = m.storage
    parts = [s.cache, s.backing] if isinstance(s, CachedStorage) else [s]
    total = 0
    for p in parts:
        if p is None or not hasattr(p, "table"):
            continue
        t = p.table
        for x in (t.keys, t.digests, t.scores, t.info, t.counters, t.free_rows):
            if (x.device.type == "cpu") == (memory == MemoryType.HOST):
                total += x.numel() * x.element_size()
        remap = p.placement.remap
        for x in () if remap is None else remap.tensors():
            if (x.device.type == "cpu") == (memory == MemoryType.HOST):
                total += x.numel() * x.element_size()
        for seg in (p.rows_space.seg0, p.rows_space.seg1):
            if seg.memory == memory:
                total += seg.nbytes
    return total


# Per-rank budgets: the planner gives each of the 2 ranks half the global one.
MODE_OPTIONS = {
    "device": dict(global_hbm_for_values=2 * 1 << 40),
    "host": dict(global_hbm_for_values=2 * 0),
    "hybrid": dict(global_hbm_for_values=2 * 300 * 96 + 17),
    "cache": dict(caching=True, global_hbm_for_values=2 * 2500 * 96),
    "cache_one_bucket": dict(caching=True, global_hbm_for_values=2 * 200 * 96),
    "no_eviction": dict(
        global_hbm_for_values=2 * 100 * 96, score_strategy=DynamicEmbScoreStrategy.NO_EVICTION
    ),
    "no_eviction_cache": dict(
        caching=True,
        global_hbm_for_values=2 * 100 * 96,
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
    ),
    "compound": dict(
        global_hbm_for_values=2 * 300 * 96,
        score_strategy=(DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", sorted(MODE_OPTIONS))
def test_planner_estimate_is_what_the_storage_allocates(mode, device):
    # dim 8, Adam: 8 + 16 floats, 96 bytes a row; 5000 rows over 2 ranks.
    config = EmbeddingConfig(name="t", embedding_dim=8, num_embeddings=10_000)
    given = DynamicEmbTableOptions(init_capacity=1000, **MODE_OPTIONS[mode])
    options = prepare_table_options(given, config, world_size=2)
    m = BatchedDynamicEmbeddingTablesV2(
        [options],
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.ADAM,
        device=torch.device(device),
    )
    plan = dynamic_shard_storage(options, torch.float32, EmbOptimType.ADAM, "cuda")
    f = m.storage.footprint()
    assert (plan.hbm, plan.ddr) == (f.device, f.host)
    on_cpu = dynamic_shard_storage(options, torch.float32, EmbOptimType.ADAM, "cpu")
    assert (on_cpu.hbm, on_cpu.ddr) == (0, f.device + f.host)
    # memory_usage: by where the bytes are.
    for memory in MemoryType:
        assert m.memory_usage(memory) == _tensor_bytes(m, memory)
    if device == "cpu":
        assert m.memory_usage(MemoryType.DEVICE) == 0
        assert m.memory_usage(MemoryType.HOST) == f.device + f.host
    else:
        assert m.memory_usage(MemoryType.DEVICE) == f.device
        assert m.memory_usage(MemoryType.HOST) == f.host


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "optimizer",
    [
        EmbOptimType.EXACT_SGD,
        EmbOptimType.ADAM,
        EmbOptimType.EXACT_ADAGRAD,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    ],
    ids=lambda o: o.name,
)
@pytest.mark.parametrize("dim", [7, 16])
def test_table_value_bytes_are_the_bytes_allocated(dim, optimizer, dtype):
    config = EmbeddingConfig(
        name="t", embedding_dim=dim, num_embeddings=1000, data_type=_DATA_TYPES[dtype]
    )
    cap = get_sharded_table_capacity(config, 1, 128)
    options = DynamicEmbTableOptions(
        dim=dim, max_capacity=cap, bucket_capacity=128, embedding_dtype=dtype
    )
    m = BatchedDynamicEmbeddingTablesV2([options], optimizer=optimizer)
    # Every row in the host tier (the default budget 0): its bytes are the rows'.
    assert m.storage.footprint().host == get_table_value_bytes(config, optimizer, 1, 128)
    # The embedding at its dtype padded to 4 bytes, the state in float32.
    emb = -(-dim * dtype.itemsize // 4) * 4
    state = {"EXACT_SGD": 0, "ADAM": 2 * dim, "EXACT_ADAGRAD": dim, "EXACT_ROWWISE_ADAGRAD": 4}
    assert m.layout.row_bytes[0] == emb + 4 * state[optimizer.name]


def test_fused_tables_keep_their_own_row_widths():
    m = module("host", dims=(4, 64), optimizer="adam", max_capacity=512)
    assert m.storage.footprint().host == 512 * (4 * 12) + 512 * (64 * 12)


def test_a_cache_budget_below_sixteen_rows_is_refused_naming_the_table():
    options = table_options("cache", (8, 12), EmbOptimType.EXACT_SGD)
    options[1].local_hbm_for_values = 15 * 48
    with pytest.raises(
        ValueError, match="table 1: caching=True needs local_hbm_for_values of at least 16 rows"
    ):
        BatchedDynamicEmbeddingTablesV2(options, optimizer=EmbOptimType.EXACT_SGD)


def test_fused_tables_must_share_their_storage_options():
    a, b = table_options("cache", (8, 8), EmbOptimType.EXACT_SGD)
    b.caching = False
    with pytest.raises(ValueError, match="share one caching"):
        BatchedDynamicEmbeddingTablesV2([a, b], optimizer=EmbOptimType.EXACT_SGD)
    a, b = table_options("host", (8, 8), EmbOptimType.EXACT_SGD)
    b.embedding_dtype = torch.float16
    with pytest.raises(ValueError, match="share one embedding_dtype"):
        BatchedDynamicEmbeddingTablesV2([a, b], optimizer=EmbOptimType.EXACT_SGD)
