"""dynamicemb used from another workspace: a dynamic table trained a few steps.

Each bag holds one raw 64-bit id, so the pooled output is that id's row and
plain SGD on 0.5 * ||row - target||^2 moves the row to
target + (1 - lr)^t * (row_0 - target) after t steps: the table's rows must
follow that closed form, whatever row_0 the initializer drew. Once with the
rows in one table, once with a cache of 32 rows (dynamicemb.storage) in front
of a host table: the 96 ids pass through the cache every step, and rows that
leave it must keep their updates in the host table.
"""

import sys

import pytest
import torch

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage import CachedStorage, HashTableStorage

CACHE_ROWS = 32


@pytest.mark.parametrize("caching", [False, True], ids=["one_table", "cache_over_host"])
def test_sgd_steps_follow_the_closed_form(caching):
    lr, steps, dim = 0.25, 5, 4
    options = DynamicEmbTableOptions(
        dim=dim,
        max_capacity=1024,
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5
        ),
        caching=caching,
        local_hbm_for_values=CACHE_ROWS * value_row_bytes(None, dim, torch.float32)
        if caching
        else 0,
    )
    table = BatchedDynamicEmbeddingTablesV2(
        [options], pooling_mode=DynamicEmbPoolingMode.SUM, learning_rate=lr
    )
    # Without a cache the rows are one hash table (a HybridStorage, device and host
    # tiers of one HashTableStorage); with one, a CachedStorage in front of a host table.
    assert isinstance(table.storage, CachedStorage if caching else HashTableStorage)
    assert isinstance(table.storage, CachedStorage) == caching
    g = torch.Generator().manual_seed(0)
    raw = torch.tensor([3, 2**40 + 7, 12345678901, 99])
    ids = torch.cat([raw, torch.randperm(92, generator=g) + 1000])
    offsets = torch.arange(ids.numel() + 1)
    target = torch.randn(ids.numel(), dim, generator=g)

    losses, first = [], None
    for _ in range(steps):
        out = table(ids, offsets)
        if first is None:
            first = out.detach().clone()  # the rows the ids got on first sight
        loss = 0.5 * ((out - target) ** 2).sum()
        loss.backward()
        losses.append(loss.item())

    table.eval()
    with torch.no_grad():
        rows = table(ids, offsets)
    torch.testing.assert_close(rows, target + (1 - lr) ** steps * (first - target))
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    if caching:
        assert table.storage.cache.table.num_slots < ids.numel()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
