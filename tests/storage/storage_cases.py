"""Modules of each storage mode over the same tables, and the batches the
storage tests train them on.

Every mode is checked against the all-device module (``mode="device"``,
every row in the device tier): the same tables, keys, initializers and
optimizer give bitwise the same outputs and rows when the tables never evict
a key, whatever tier a row is in and however often it moves.
"""

import dataclasses

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
from tests.storage.py_dict_storage import PyDictStorage

OPTIMIZERS = {
    "sgd": (EmbOptimType.EXACT_SGD, {"learning_rate": 0.3}),
    "adam": (EmbOptimType.ADAM, {"learning_rate": 0.05}),
}

# The modes: options over the all-device table's (cache rows are per table).
MODES = {
    "device": dict(budget="all"),
    "host": dict(budget=0),
    "hybrid": dict(budget="half"),
    "cache": dict(caching=True, cache_rows=128),
    "cache_prefetch": dict(caching=True, cache_rows=128, prefetch=True),
    # Fewer cache rows than a batch's distinct keys of a table: overflow.
    "cache_small": dict(caching=True, cache_rows=16),
    "external_cache": dict(caching=True, cache_rows=128, external=True),
    "external": dict(external=True),
}


def table_options(
    mode: str,
    dims,
    optimizer,
    max_capacity: int = 4096,
    init_capacity: int | None = None,
    dtype=torch.float32,
    **kw,
) -> list[DynamicEmbTableOptions]:
    """Options of the tables (one per dim) in ``mode``."""
    m = MODES[mode]
    out = []
    for d in dims:
        rb = value_row_bytes(optimizer, d, dtype)
        if m.get("caching"):
            budget = m["cache_rows"] * rb
        elif m.get("budget") == "all":
            budget = max_capacity * rb
        elif m.get("budget") == "half":
            budget = max_capacity * rb // 2
        else:
            budget = m.get("budget", 0)
        out.append(
            DynamicEmbTableOptions(
                dim=d,
                max_capacity=max_capacity,
                init_capacity=init_capacity,
                bucket_capacity=128,
                embedding_dtype=dtype,
                initializer_args=DynamicEmbInitializerArgs(
                    mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5
                ),
                caching=bool(m.get("caching")),
                local_hbm_for_values=budget,
                external_storage=PyDictStorage if m.get("external") else None,
                **kw,
            )
        )
    return out


def module(
    mode: str,
    dims=(8, 12),
    optimizer: str = "sgd",
    pooling=DynamicEmbPoolingMode.SUM,
    device="cpu",
    **kw,
) -> BatchedDynamicEmbeddingTablesV2:
    opt, args = OPTIMIZERS[optimizer]
    return BatchedDynamicEmbeddingTablesV2(
        table_options(mode, dims, opt, **kw),
        pooling_mode=pooling,
        optimizer=opt,
        device=torch.device(device),
        **args,
    )


def batches(steps: int, num_features: int, batch: int = 24, vocab: int = 2000, seed: int = 0):
    """(indices, offsets) of ``steps`` pooled batches: bags of 0..5 keys drawn
    from a power law over ``vocab`` ids, so keys come back often."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 6, (num_features * batch,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        u = torch.rand(int(lengths.sum()), generator=g)
        indices = (vocab * u**3).long()  # skewed towards small ids
        out.append((indices, offsets))
    return out


def fixed_batches(steps: int, batch: int = 24, hotness: int = 3, vocab: int = 2000):
    """Pooled batches of two features and one shape (``hotness`` ids per
    bag), keys from a power law: what a CUDA graph of the lookup replays."""
    g = torch.Generator().manual_seed(3)
    bags = 2 * batch
    offsets = torch.arange(0, bags * hotness + 1, hotness)
    return [
        ((vocab * torch.rand(bags * hotness, generator=g) ** 3).long(), offsets)
        for _ in range(steps)
    ]


def train(m, steps, prefetch: bool = False, device="cpu", first: int = 0):
    """Trains ``m`` on ``steps`` (a fixed gradient per step; ``first``: the
    index of the first step); returns the outputs. With ``prefetch``, batch
    i + 1 is prefetched between the forward and the backward of batch i, as
    TorchRec's prefetch pipeline does."""
    outs = []
    for i, (indices, offsets) in enumerate(steps):
        out = m(indices.to(device), offsets.to(device))
        if prefetch and i + 1 < len(steps):
            m.prefetch(steps[i + 1][0].to(device), steps[i + 1][1].to(device))
        g = torch.Generator().manual_seed(100 + first + i)
        out.backward(torch.randn(out.shape, generator=g).to(device))
        outs.append(out.detach().cpu())
    return outs


def rows_of(m, keys_per_table):
    """(found, embeddings, optimizer state) of each table's keys."""
    out = []
    for t, keys in enumerate(keys_per_table):
        k = torch.tensor(sorted(keys), dtype=torch.int64, device=m.device)
        found, emb, state = m.storage.read_rows(k, torch.full_like(k, t))
        out.append(
            (found.cpu(), emb[:, : m.dims[t]].cpu(), state[:, : m.layout.state_dims[t]].cpu())
        )
    return out


def seen_keys(steps, feature_table_map):
    """The keys each table saw."""
    seen = [set() for _ in range(max(feature_table_map) + 1)]
    for indices, offsets in steps:
        batch = (offsets.numel() - 1) // len(feature_table_map)
        for f, t in enumerate(feature_table_map):
            lo, hi = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
            seen[t].update(indices[lo:hi].tolist())
    return seen


def replace(options, **kw):
    return [dataclasses.replace(o, **kw) for o in options]


def assert_trains_like_device(mode, optimizer, pooling, device, dims, steps=20, **kw):
    """Trains a module of ``mode`` and the all-device module on the same
    batches; asserts every step's outputs and, at the end, every seen key's
    row (embedding and optimizer state) are bitwise equal. Returns (module,
    all-device module, batches)."""
    reference = module("device", dims, optimizer, pooling, device=device, **kw)
    m = module(mode, dims, optimizer, pooling, device=device, **kw)
    data = batches(steps, len(dims))
    want = train(reference, data, device=device)
    got = train(m, data, prefetch=MODES[mode].get("prefetch", False), device=device)
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), (mode, step)
    seen = seen_keys(data, list(range(len(dims))))
    for t, ((fg, eg, sg), (fw, ew, sw)) in enumerate(
        zip(rows_of(m, seen), rows_of(reference, seen))
    ):
        assert bool(fw.all()) and bool(fg.all()), (mode, t)
        assert torch.equal(eg, ew), (mode, t)
        assert torch.equal(sg, sw), (mode, t)
    return m, reference, data
