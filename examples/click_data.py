"""The main job's batches (examples/train_dlrm.py): generated click logs, and
those of TSV files (click_tsv.py), both as ``Batch``es with the data position
a checkpoint records.

The generated data: power-law (Zipf-like) ranks hashed over the int64 range
by SplitMix64 into raw ids, and a click label drawn from a hidden model (a
weight per id of every feature, from the id, plus a linear function of the
dense features), so a model can learn it and the loss fall well below
log(2). Batch ``(split, step, rank)`` depends only on the seed: the data
position is the step. make_sample_data.py writes files from the same hash
and power law.
"""

from dataclasses import dataclass
from typing import Any

import click_tsv  # examples/click_tsv.py, next to this script
import torch

NUM_DENSE = click_tsv.NUM_DENSE
# int64 arithmetic wraps around: the multipliers are the signed views of
# 64-bit odd constants (golden ratio; SplitMix64's).
GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def wrap_int64(x: int) -> int:
    """A Python int as the int64 it wraps to."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 (wrapping arithmetic)."""
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def raw_ids(ranks: torch.Tensor, salt: int) -> torch.Tensor:
    """The raw 64-bit id of each power-law rank: spread over all of int64,
    the reserved smallest values excluded."""
    ids = splitmix64(ranks * GOLDEN + wrap_int64(salt))
    reserved = click_tsv.RESERVED_KEYS
    return torch.where(ids < click_tsv.INT64_MIN + reserved, ids + reserved, ids)


def hidden_weight(ids: torch.Tensor, salt: int) -> torch.Tensor:
    """The hidden model's weight of each id: uniform in [-1, 1), from the id."""
    h = _shr(splitmix64(ids ^ wrap_int64(salt * _MIX2)), 11)  # 53 random bits
    return h.to(torch.float64) * (2.0 / (1 << 53)) - 1.0


def power_law_ranks(g: torch.Generator, n: int, vocab: int, alpha: float) -> torch.Tensor:
    """Ranks in [1, vocab] with P(rank r) ~ r^-alpha (inverse CDF of the
    continuous power law, floored)."""
    u = torch.rand(n, generator=g, dtype=torch.float64)
    a = 1.0 - alpha
    r = ((vocab**a - 1.0) * u + 1.0) ** (1.0 / a)
    return r.to(torch.int64).clamp_(1, vocab)


@dataclass
class Batch:
    dense: torch.Tensor  # (B, NUM_DENSE) float32
    values: torch.Tensor  # int64, feature-major as a KeyedJaggedTensor wants
    lengths: torch.Tensor  # (len(features) * B) int64
    labels: torch.Tensor  # (B) float32
    true_logits: torch.Tensor | None = None  # (B) float32: the hidden model's logit


class ClickData:
    """Deterministic generated click logs of ``features`` (each with
    ``dynamic``, ``vocab``, ``capacity`` and ``max_length``): batch
    ``(split, step, rank)`` is the same whatever the world size or device."""

    # Strength of the hidden model's parts.
    SPARSE_SCALE = 1.6
    DENSE_SCALE = 0.6

    def __init__(self, alpha: float, seed: int, features) -> None:
        self.alpha = alpha
        self.seed = seed
        self.features = features
        g = torch.Generator().manual_seed(seed)
        self.dense_w = torch.randn(NUM_DENSE, generator=g, dtype=torch.float64)
        self.dense_w *= self.DENSE_SCALE / self.dense_w.norm()

    def batch(self, split: int, step: int, rank: int, batch_size: int) -> Batch:
        g = torch.Generator().manual_seed(
            ((self.seed * 7 + split) * 1_000_003 + step) * 4099 + rank
        )
        dense = torch.randn(batch_size, NUM_DENSE, generator=g, dtype=torch.float64)
        logit = dense @ self.dense_w
        values, lengths = [], []
        for i, f in enumerate(self.features):
            lens = torch.randint(1, f.max_length + 1, (batch_size,), generator=g)
            n = int(lens.sum())
            if f.dynamic:
                ids = raw_ids(power_law_ranks(g, n, f.vocab, self.alpha), salt=i + 1)
            else:
                # Categorical with a skew of its own.
                ids = power_law_ranks(g, n, f.capacity, 1.2) - 1
            w = hidden_weight(ids, salt=i + 101)
            bag = torch.repeat_interleave(torch.arange(batch_size), lens, output_size=n)
            mean_w = torch.zeros(batch_size, dtype=torch.float64).index_add_(0, bag, w) / lens
            logit = logit + self.SPARSE_SCALE * mean_w
            values.append(ids)
            lengths.append(lens)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        return Batch(
            dense=dense.float(),
            values=torch.cat(values),
            lengths=torch.cat(lengths),
            labels=labels.float(),
            true_logits=logit.float(),
        )


class GeneratedBatches:
    """Rank ``rank``'s generated training batches from step ``step`` on; the
    data position is the step."""

    def __init__(self, data: ClickData, step: int, rank: int, batch_size: int) -> None:
        self.data, self.step, self.rank, self.batch_size = data, step, rank, batch_size

    def __next__(self) -> Batch:
        b = self.data.batch(0, self.step, self.rank, self.batch_size)
        self.step += 1
        return b

    def position(self) -> dict[str, Any]:
        return {"step": self.step}


class FileBatches:
    """Rank ``rank``'s batches of a TSV stream; the data position is the
    stream's cursor (the same on every rank)."""

    def __init__(self, stream: click_tsv.ClickFiles) -> None:
        self.stream = stream
        self.batches = iter(stream)

    def __next__(self) -> Batch:
        dense, values, lengths, labels = next(self.batches)
        return Batch(dense, values, lengths, labels)

    def position(self) -> dict[str, Any]:
        return {"cursor": self.stream.cursor.to_json()}
