"""A lookup of an inference table, as torch ops over one state (state.py).

The input is FBGEMM's TBE convention: ``ids`` (n) and ``offsets`` (F B + 1)
over F features of B bags each, feature f's bags being ``offsets[f B :
(f + 1) B + 1]``. Per group of tables (one dim), every id is found in the
group's index (an id of another group's table, or one the group does not
hold, reads its table's default row), then:

* pooled (SUM, MEAN): each bag's weighted sum of its rows, (F B, dim) per
  group; feature f's bags of its group are the output's columns of f, the
  features side by side: (B, sum of the features' dims), as TorchRec's
  EmbeddingBagCollection and FBGEMM's TBE give it. MEAN is SUM with the
  weight 1 / (bag length) for every id of a bag.
* sequence (NONE): each id's row, (n, dim), one dim for every table.

A table whose default is a random initializer (not CONSTANT) adds the
initializer's row of each key it does not hold (``init_rows``: a function of
the seed, the table's initializer id and the key, as the training table's
eval lookup makes it).

Every shape here follows the input's (no value is read on the host), so a
lookup exports and compiles whole.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dynamicemb.inference.formats import Pool
from dynamicemb.inference.state import Group, GroupRows

__all__ = ["RandomDefault", "lookup"]


@dataclass(frozen=True)
class RandomDefault:
    """A table whose unknown keys read an initializer's rows: its group,
    its local id there, the ``init_rows`` arguments (mode, mean, std_dev,
    lower, upper, value) and its initializer table id."""

    group: int
    local: int
    op_args: tuple[int, float, float, float, float, float]
    init_id: int


def _feature_of(offsets: torch.Tensor, num_features: int, batch: int, n) -> torch.Tensor:
    """(n) int64: the feature of each id."""
    device = offsets.device
    bounds = offsets[torch.arange(num_features + 1, device=device) * batch]
    counts = bounds[1:] - bounds[:-1]
    features = torch.arange(num_features, device=device)
    return torch.repeat_interleave(features, counts, output_size=n)


def _mean_weights(offsets: torch.Tensor, n) -> torch.Tensor:
    lengths = offsets[1:] - offsets[:-1]
    inv = 1.0 / lengths.clamp(min=1).to(torch.float32)
    return torch.repeat_interleave(inv, lengths, output_size=n)


def lookup(
    groups: tuple[Group, ...],
    rows: tuple[GroupRows, ...],
    feature_locals: list[torch.Tensor],
    feature_groups: list[int],
    dims: list[int],
    pooled: bool,
    mean: bool,
    pool: Pool,
    randoms: tuple[RandomDefault, ...],
    init_rows,
    seed: int,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """One lookup (see the module docstring).

    Args:
        groups, rows: the module's groups and this state's rows of each.
        feature_locals: per group, (F) int32: each feature's table's local
            id in the group, -1 for a table of another group.
        feature_groups, dims: each feature's group and dim.
        pooled, mean: SUM or MEAN (pooled), else NONE.
        pool: how the rows of a bag are pooled (formats.pooler).
        randoms, init_rows, seed: the tables with random defaults, the
            ``init_rows`` op (None without them), the generator's seed.
        ids, offsets: the batch (int64); weights: (n) float32 or None.
    """
    num_features = len(feature_groups)
    n = ids.shape[0]
    batch = (offsets.shape[0] - 1) // num_features
    need_features = len(groups) > 1 or any(len(g.tables) > 1 for g in groups) or randoms
    feature = _feature_of(offsets, num_features, batch, n) if need_features else None
    if mean:
        weights = _mean_weights(offsets, n)
    outs = []
    for g, (group, grows) in enumerate(zip(groups, rows)):
        local = None
        if len(group.tables) > 1 or len(groups) > 1 or randoms:
            local = feature_locals[g].index_select(0, feature)
        held, found = grows.index.locate(ids, local if len(group.tables) > 1 else None)
        if local is not None and len(groups) > 1:
            found = found & (local >= 0)
        default = torch.zeros_like(ids) if local is None else local.long().clamp(min=0)
        slots = torch.where(found, held, default)
        extra = None
        for r in randoms:
            if r.group != g:
                continue
            mine = ~found & (local == r.local)
            init_ids = torch.full_like(ids, r.init_id)
            init = init_rows(ids, init_ids, group.dim, *r.op_args, seed)
            init = init * mine[:, None].to(init.dtype)
            extra = init if extra is None else extra + init
        if pooled:
            out = pool(grows.storage, slots, offsets, weights, group.dim)
            if extra is not None:
                arange = torch.arange(n, dtype=ids.dtype, device=ids.device)
                out = out + F.embedding_bag(
                    arange,
                    extra,
                    offsets,
                    mode="sum",
                    per_sample_weights=weights,
                    include_last_offset=True,
                )
        else:
            out = group.fmt.decode(grows.storage.index_select(0, slots), group.dim)
            if extra is not None:
                out = out + extra
        outs.append(out)
    if not pooled:
        return outs[0]
    if len(groups) == 1:
        dim = groups[0].dim
        return outs[0].view(num_features, batch, dim).transpose(0, 1).reshape(batch, -1)
    parts = [
        outs[feature_groups[f]].view(num_features, batch, dims[f])[f] for f in range(num_features)
    ]
    return torch.cat(parts, dim=1)
