"""Random batches in TBE layout, and the module they train, for the
module's training-step tests."""

import torch

from dynamicemb import DynamicEmbPoolingMode
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

# The features of random_batches' default three: the second table has two.
FEATURE_TABLES = [0, 1, 1]


def unchecked_module(options, optimizer, pooling, device, learning_rate, **optimizer_args):
    """A module of ``options`` over FEATURE_TABLES, run as the sharded
    modules run it: forward does not read its inputs' values back
    (``check_values`` off), so a step synchronizes nothing and traces whole."""
    module = BatchedDynamicEmbeddingTablesV2(
        options,
        FEATURE_TABLES,
        pooling_mode=DynamicEmbPoolingMode[pooling],
        optimizer=optimizer,
        device=device,
        learning_rate=learning_rate,
        **optimizer_args,
    )
    module.check_values = False
    return module


def random_batches(device, steps, batch, vocab, seed, features=3, weights=False):
    """``steps`` batches of ``features`` features, 0-3 ids per bag from
    ``[0, vocab)``: (keys, offsets) on ``device``, with per-id weights in
    [0, 1) appended when ``weights``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (features * batch,), generator=g)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        keys = torch.randint(0, vocab, (int(offsets[-1]),), generator=g)
        b = (keys.to(device), offsets.to(device))
        if weights:
            b += (torch.rand(keys.numel(), generator=g).to(device),)
        out.append(b)
    return out


def train_step(module, batch, extra=None):
    """One training step of ``batch`` = (keys, offsets, weights): the weights
    as pooling weights (``extra="pooling_weights"``), as frequency counters
    (``"frequency_counters"``: 4 x weight, rounded down) or unused; loss =
    the sum of the squared outputs. Returns the (detached) output."""
    keys, offsets, weights = batch
    kw = {}
    if extra == "pooling_weights":
        kw["pooling_weights"] = weights
    elif extra == "frequency_counters":
        kw["frequency_counters"] = (weights * 4).long()
    out = module(keys, offsets, **kw)
    (out * out).sum().backward()
    return out.detach()
