"""Padded batches on the CPU backend.

A storage that ``takes_padded_batches`` gets batches of the batch's length
whose distinct keys come first and whose tail is padding (``PAD_KEY``); on a
GPU the table kernels skip padding, so a padded batch goes to them whole. The
CPU kernels refuse ``PAD_KEY``: they get the distinct keys only, cut out on
the host, where reading their number costs nothing. The rows of the entries
not given to the kernels are -1 (not stored).
"""

from collections.abc import Callable

import torch

from dynamicemb.storage.scores import BatchScore
from dynamicemb.storage.types import RowInit
from dynamicemb.table import PAD_KEY

Train = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, BatchScore, RowInit], torch.Tensor]


def _custom(score: BatchScore) -> torch.Tensor | None:
    """A score of each key (CUSTOMIZED), which is cut like the keys."""
    return score.custom if isinstance(score.custom, torch.Tensor) else None


def train_prefix(train: Train, keys, tids, counts, score: BatchScore, init, num_keys):
    """``train`` of the first ``num_keys`` (a one-element tensor) entries."""
    u = int(num_keys)
    # Under torch.compile (capture_scalar_outputs) u is a symbolic size.
    torch._check(u >= 0)
    torch._check(u <= keys.numel())
    custom = _custom(score)
    if custom is not None:
        score = BatchScore(score.step, custom[:u])
    rows = train(keys[:u], tids[:u], counts[:u], score, init)
    return torch.cat([rows, rows.new_full((keys.numel() - rows.numel(),), -1)])


def train_selected(train: Train, keys, tids, counts, score: BatchScore, init, lookup):
    """``train`` of the entries the mask ``lookup`` sets."""
    idx = lookup.nonzero().squeeze(1)
    custom = _custom(score)
    if custom is not None:
        score = BatchScore(score.step, custom.index_select(0, idx))
    rows = train(*(t.index_select(0, idx) for t in (keys, tids, counts)), score, init)
    return keys.new_full(keys.shape, -1).index_copy_(0, idx, rows)


def train_padded(train: Train, keys, tids, counts, score: BatchScore, init, num_keys, lookup):
    """``TableStorage.train_rows`` of a storage that ``takes_padded_batches``,
    through ``train`` of exact (CPU) or padded (GPU) batches: on a GPU the
    entries ``lookup`` leaves out are made padding, which the kernels skip;
    on the CPU only the keys to look up go to ``train``."""
    cpu = keys.device.type == "cpu"
    if lookup is not None:
        if cpu:
            return train_selected(train, keys, tids, counts, score, init, lookup)
        keys = torch.where(lookup, keys, PAD_KEY)
    elif num_keys is not None and cpu:
        return train_prefix(train, keys, tids, counts, score, init, num_keys)
    return train(keys, tids, counts, score, init)
