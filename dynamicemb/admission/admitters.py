"""The admitters the provided strategies create: what a module runs to decide.

``MultiTableFrequencyAdmitter`` counts into a ``MultiTableKVCounter`` and admits
a key once its count reaches the threshold; ``MultiTableProbabilisticAdmitter``
tosses a coin per occurrence and keeps nothing.
"""

import math

import torch

from dynamicemb.admission.counters import MultiTableKVCounter
from dynamicemb.embedding.admission import PaddedAdmitter
from dynamicemb.embedding.initializer import MultiTableInitializer
from dynamicemb.table import ScoredHashTable
from dynamicemb.types import Counter, MultiTableAdmitter

__all__ = ["MultiTableFrequencyAdmitter", "MultiTableProbabilisticAdmitter"]


def _frequencies(keys: torch.Tensor, frequencies: torch.Tensor | None) -> torch.Tensor:
    """The batch's occurrences of each key: one each when not counted."""
    if frequencies is None:
        return torch.ones(keys.shape, dtype=torch.int64, device=keys.device)
    if frequencies.shape != keys.shape:
        raise ValueError(
            f"frequencies must have one entry per key ({keys.numel()}), got shape "
            f"{tuple(frequencies.shape)}"
        )
    return frequencies


class _OwnInitializer(MultiTableAdmitter):
    """An admitter whose rejected rows the given initializer writes (None: the
    tables' own initializers)."""

    def __init__(self, initializer: MultiTableInitializer | None) -> None:
        self._initializer = initializer

    @property
    def non_admitted_initializer(self) -> MultiTableInitializer | None:
        return self._initializer


class MultiTableFrequencyAdmitter(_OwnInitializer, PaddedAdmitter):
    """Admits a missing key once its count reaches the threshold.

    A key's count is what the counter accumulated for it plus this batch's
    occurrences; a key that reaches the threshold is admitted and leaves the
    counter in the same step (``MultiTableKVCounter.add_and_release``). With
    threshold 0 or 1 every key is admitted at once and nothing is counted.

    A module whose storage keeps its keys in one table asks it about a
    padded batch instead (``admit_padded``: the lookup and the count in one
    op, ``MultiTableKVCounter.admit_missing``), with the same decisions.

    Args:
        threshold (int): the count that admits, >= 0.
        counter (MultiTableKVCounter): the tables' fused counter.
        initializer (Optional[MultiTableInitializer]): writes the rows of
            rejected keys; None for the tables' own initializers.
    """

    def __init__(
        self,
        threshold: int,
        counter: MultiTableKVCounter,
        initializer: MultiTableInitializer | None = None,
    ) -> None:
        super().__init__(initializer)
        self.threshold = int(threshold)
        self.counter = counter

    def admit(self, keys, table_ids, frequencies=None) -> torch.Tensor:
        counts = self.counter.add_and_release(
            keys, table_ids, _frequencies(keys, frequencies), self.threshold
        )
        return counts >= self.threshold

    def takes_padded(self, store: ScoredHashTable) -> bool:
        # By the tensors' devices: a device without an index names the current one.
        same_device = store.keys.device == self.counter.table.keys.device
        return same_device and store.num_tables == self.counter.num_tables

    def admit_padded(self, keys, table_ids, frequencies, store):
        return self.counter.admit_missing(keys, table_ids, frequencies, self.threshold, store)

    def graph_state(self) -> tuple:
        t = self.counter.table
        tensors = self.counter.state_tensors()
        return (*(x.data_ptr() for x in tensors), t.total_buckets, self.threshold)

    def state(self) -> Counter:
        return self.counter


class MultiTableProbabilisticAdmitter(_OwnInitializer):
    """Admits each occurrence of a missing key with a fixed probability.

    A key occurring k times in a batch gets k tosses, i.e. one toss against
    ``1 - (1 - p)**k``, computed as ``-expm1(k * log1p(-p))`` so that a small
    ``p`` is not lost in ``1 - p``. The tosses come from a generator of the
    admitter's own on its device (seeded with ``seed``), so admission does not
    move the global random stream, and a seeded run repeats.

    Args:
        probability (float): in (0, 1].
        device (torch.device): where the tosses are drawn.
        seed (int): the generator's seed.
        initializer (Optional[MultiTableInitializer]): as for
            ``MultiTableFrequencyAdmitter``.
    """

    def __init__(
        self,
        probability: float,
        device: torch.device,
        seed: int,
        initializer: MultiTableInitializer | None = None,
    ) -> None:
        super().__init__(initializer)
        self.probability = float(probability)
        self._log_reject = math.log1p(-self.probability) if self.probability < 1.0 else None
        self.generator = torch.Generator(device=torch.device(device))
        self.generator.manual_seed(int(seed))

    def admit(self, keys, table_ids, frequencies=None) -> torch.Tensor:
        if self._log_reject is None:  # p == 1
            return torch.ones(keys.shape, dtype=torch.bool, device=keys.device)
        draws = torch.rand(
            keys.shape, generator=self.generator, dtype=torch.float64, device=keys.device
        )
        k = _frequencies(keys, frequencies).to(torch.float64)
        return draws < -torch.expm1(k * self._log_reject)
