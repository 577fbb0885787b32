"""Checkpoints and streams of trained sharded models for the inference
tests, the rows they hold read straight from the training tables, and a
float64 reference lookup over those rows.

A job is the checkpoint tests' model (``ckpt_harness``): an
EmbeddingBagCollection of dynamic tables, trained on gloo ranks and dumped
with ``DynamicEmbDump``. ``rows_of`` is what its tables held, read from their
hash tables and value buffers (``ckpt_harness.contents``), not through the
checkpoint; ``reference`` pools those rows in float64.
"""

import os

import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
COLL = c.COLLECTION


def case(name: str = "serve", dims=(8, 8, 4), embedding_dtype=None, **kw) -> c.Case:
    """Three tables (two of one dim) whose keys overlap (0..399, and
    some negative), trained with Adam for a few steps."""
    options = {} if embedding_dtype is None else {"embedding_dtype": embedding_dtype}
    tables = [
        T(f"t{i}", 1024, d, initializer="uniform", dist_type="hash_roundrobin")
        for i, d in enumerate(dims)
    ]
    return c.Case(
        name,
        "ebc",
        tables,
        optimizer="adam",
        key_range=(-20, 400),
        batch_size=16,
        max_length=6,
        steps=kw.pop("steps", 3),
        options=options,
        **kw,
    )


def features(cs: c.Case) -> dict[str, list[str]]:
    return {t.name: [t.feature] for t in cs.tables}


def dump_job(rank: int, world: int, cs: c.Case, path: str):
    """Trains ``cs`` at ``world`` ranks and dumps it to ``path``; returns
    this rank's table contents."""
    from dynamicemb import DynamicEmbDump

    model = c.build(cs, world)
    c.train(model, cs, rank)
    DynamicEmbDump(path, model)
    return c.contents(model)


def checkpoint(cs: c.Case, path: str, world: int = 2) -> dict[str, dict[str, torch.Tensor]]:
    """Dumps a trained ``cs`` at ``world`` ranks to ``path``; returns every
    table's rows (keys sorted, float64 embeddings)."""
    return rows_of(h.run_world(dump_job, world, cs, path))


def rows_of(per_rank) -> dict[str, dict[str, torch.Tensor]]:
    merged = c.merge(per_rank)
    return {n: {"keys": t["keys"], "emb": t["emb"].double()} for n, t in merged.items()}


def lookup_rows(rows: dict[str, torch.Tensor], keys: torch.Tensor, default) -> torch.Tensor:
    """(n, dim) float64: each key's row in a table's ``rows``, ``default``
    ((n, dim)) where the table does not hold it."""
    pos = torch.searchsorted(rows["keys"], keys).clamp(max=max(rows["keys"].numel() - 1, 0))
    held = rows["keys"].numel() > 0 and rows["keys"][pos] == keys
    if rows["keys"].numel() == 0:
        return default.double()
    return torch.where(held[:, None], rows["emb"][pos], default.double())


def feature_of(offsets: torch.Tensor, num_features: int) -> torch.Tensor:
    """(n) int64: the feature of each id of a TBE batch."""
    batch = (offsets.numel() - 1) // num_features
    out = torch.empty(int(offsets[-1]), dtype=torch.int64)
    for f in range(num_features):
        out[int(offsets[f * batch]) : int(offsets[(f + 1) * batch])] = f
    return out


def pool(values, offsets, weights, mode, dims):
    """Float64 pooling of per-id ``values`` ((dim,) each) into TBE bags:
    (B, sum of ``dims``), feature by feature; ``mode`` "sum" (``weights``
    per id, None: ones), "mean", or "none" (the values stacked)."""
    if mode == "none":
        return torch.stack(values) if values else torch.empty(0)
    num_features = len(dims)
    batch = (offsets.numel() - 1) // num_features
    outs = []
    for b in range(batch):
        parts = []
        for f in range(num_features):
            lo, hi = int(offsets[f * batch + b]), int(offsets[f * batch + b + 1])
            acc = torch.zeros(dims[f], dtype=torch.float64)
            for i in range(lo, hi):
                w = 1.0 if weights is None else float(weights[i])
                acc += (1.0 / (hi - lo) if mode == "mean" else w) * values[i]
            parts.append(acc)
        outs.append(torch.cat(parts))
    return torch.stack(outs)


def rows_per_id(tables, feature_tables, ids, offsets, defaults) -> list[torch.Tensor]:
    """Each id's float64 row in its feature's table (``feature_tables[f]``:
    the rows of feature f's table), ``defaults[f](keys)`` for keys the table
    does not hold."""
    feature = feature_of(offsets, len(feature_tables))
    rows = [None] * ids.numel()
    for f, name in enumerate(feature_tables):
        sel = (feature == f).nonzero().reshape(-1)
        if sel.numel():
            got = lookup_rows(tables[name], ids[sel], defaults[f](ids[sel]))
            for j, i in enumerate(sel.tolist()):
                rows[i] = got[j]
    return rows


def reference(tables, feature_tables, ids, offsets, weights, mode, defaults):
    """Float64 pooling (``mode``: "sum", "mean" or "none") of the TBE input
    (``ids``, ``offsets``) over the rows ``rows_per_id`` reads."""
    rows = rows_per_id(tables, feature_tables, ids, offsets, defaults)
    dims = [tables[n]["emb"].shape[1] for n in feature_tables]
    return pool(rows, offsets, weights, mode, dims)


def batch(num_features: int, batch_size: int, seed: int, key_range=(-30, 450), max_length=7):
    """A TBE batch of keys in ``key_range`` (some the tables never saw),
    with weights: (ids, offsets, weights)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_length + 1, (num_features * batch_size,), generator=g)
    n = int(lengths.sum())
    ids = torch.randint(key_range[0], key_range[1], (n,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.rand(n, generator=g) * 2 - 0.5
    return ids, offsets, weights


def folder(root: str, name: str) -> str:
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    return path
