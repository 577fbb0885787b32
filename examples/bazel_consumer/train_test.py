"""dynamicemb used from another workspace: a dynamic table trained a few steps.

Each bag holds one raw 64-bit id, so the pooled output is that id's row and
plain SGD on 0.5 * ||row - target||^2 moves the row to
target + (1 - lr)^t * (row_0 - target) after t steps: the table's rows must
follow that closed form, whatever row_0 the initializer drew.
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
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2


def test_sgd_steps_follow_the_closed_form():
    lr, steps, dim = 0.25, 5, 4
    options = DynamicEmbTableOptions(
        dim=dim,
        max_capacity=1024,
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5
        ),
    )
    table = BatchedDynamicEmbeddingTablesV2(
        [options], pooling_mode=DynamicEmbPoolingMode.SUM, learning_rate=lr
    )
    ids = torch.tensor([3, 2**40 + 7, 12345678901, 99])
    offsets = torch.arange(ids.numel() + 1)
    target = torch.randn(ids.numel(), dim, generator=torch.Generator().manual_seed(0))

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
    assert int(table.table.size()[0]) == ids.numel()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
