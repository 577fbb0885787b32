"""Random batches in TBE layout for the module's training-step tests."""

import torch


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
