"""On a GPU the tiers are device memory and pinned host memory the kernels
address directly, and the device memory a table takes is bounded by its
budget whatever the table's size."""

import gc

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage import CachedStorage
from dynamicemb.types import MemoryType

pytestmark = pytest.mark.gpu

GIB, MIB = 1 << 30, 1 << 20


def _allocated_by(build):
    """``build()`` with the allocator's history on: its result, the device
    bytes the tensors it allocated and still holds asked for (blocks the
    history saw allocated meanwhile, still live: tensors of earlier tests
    freed meanwhile do not lower it; the caching allocator rounds large blocks
    up to 2 MiB, which the requested sizes leave out), and those bytes summed
    by the dynamicemb lines that asked for them, largest first (what a failure
    of the bounds below shows)."""
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        result = build()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    sites: dict[str, int] = {}
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            frames = block.get("frames") or []
            if block["state"] != "active_allocated" or not frames:
                continue
            ours = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']}" for f in frames]
            ours = [x for x, f in zip(ours, frames) if "dynamicemb" in f["filename"]]
            key = " < ".join(ours[:4]) or "outside dynamicemb"
            sites[key] = sites.get(key, 0) + block.get("requested_size", block["size"])
    return result, sum(sites.values()), sorted(sites.items(), key=lambda kv: -kv[1])[:12]


@pytest.mark.parametrize("caching", [False, True], ids=["hybrid", "cache"])
def test_a_table_of_several_gib_with_a_1_mib_budget_takes_little_device_memory(caching):
    dim, opt = 128, EmbOptimType.ADAM
    rb = value_row_bytes(opt, dim, torch.float32)  # 1536 bytes
    rows = (4 * GIB // rb) // 128 * 128  # a 4 GiB table
    options = DynamicEmbTableOptions(
        dim=dim,
        max_capacity=rows,
        bucket_capacity=128,
        caching=caching,
        local_hbm_for_values=MIB,
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.1, upper=0.1
        ),
    )
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    m, on_device, sites = _allocated_by(
        lambda: BatchedDynamicEmbeddingTablesV2(
            [options],
            pooling_mode=DynamicEmbPoolingMode.SUM,
            optimizer=opt,
            device=torch.device("cuda"),
            learning_rate=0.01,
        )
    )
    full = rows * rb
    # Rows on the device within the budget; the rest is the keys' metadata
    # (17 bytes a slot against 1536 bytes a row): one table's and its row map
    # (8 bytes a row) for the hybrid table (1.6 % of the rows' bytes), the
    # backing table's and the cache's for the cache (3.4 % on the H200).
    # What the storage reports, up to a few bytes of the module's own.
    usage = m.memory_usage(MemoryType.DEVICE)
    tiers = {"storage": m.storage.footprint()}
    if isinstance(m.storage, CachedStorage):
        tiers["backing"] = m.storage.backing.footprint()
    assert usage <= on_device <= usage + 4 * 1024, (on_device, usage, tiers, sites)
    assert on_device < full // 25
    assert m.memory_usage(MemoryType.HOST) >= full - MIB
    storage = m.storage.backing if isinstance(m.storage, CachedStorage) else m.storage
    host = storage.rows_space.seg1
    assert host.memory == MemoryType.HOST and host.host_view.is_pinned()
    assert host.data.device.type == "cuda"  # the kernels' view of it
    # It trains: keys far beyond the budget's rows, read back after an update.
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 1 << 40, (20_000,), generator=g).cuda()
    offsets = torch.arange(0, 20_001, 4).cuda()
    out = m(keys, offsets)
    out.sum().backward()
    torch.cuda.synchronize()
    assert bool(torch.isfinite(out).all())
    u = torch.unique(keys)
    found, _, state = m.storage.read_rows(u, torch.zeros_like(u))
    assert bool(found.all())
    assert bool((state[:, dim:].abs().sum(1) > 0).all())  # every row was updated (Adam's v)
    assert torch.cuda.memory_allocated() - before < full // 25
