"""The admission strategies dynamicemb provides: inert configurations that
create the admitters of admitters.py.

``FrequencyAdmissionStrategy`` admits a key once it has been seen often
enough and carries the ``KVCounter`` it counts into; ``ProbabilisticAdmissionStrategy``
admits by a coin toss per occurrence and keeps no state.
"""

import math
from collections.abc import Sequence
from typing import Any

import torch

from dynamicemb._checks import as_int
from dynamicemb.admission.admitters import (
    MultiTableFrequencyAdmitter,
    MultiTableProbabilisticAdmitter,
)
from dynamicemb.admission.counters import MultiTableKVCounter, check_kv_counter, counter_layout
from dynamicemb.dynamicemb_config import DynamicEmbInitializerArgs
from dynamicemb.embedding.initializer import MultiTableInitializer
from dynamicemb.types import AdmissionStrategy, KVCounter

__all__ = [
    "DEFAULT_KV_COUNTER",
    "FrequencyAdmissionStrategy",
    "ProbabilisticAdmissionStrategy",
]

# The counter share of a table whose FrequencyAdmissionStrategy names none:
# 2**20 keys waiting to be admitted (about 17 MiB).
DEFAULT_KV_COUNTER = KVCounter(capacity=1 << 20)


def _check_initializer_args(owner: str, args: Any) -> None:
    if args is not None and not isinstance(args, DynamicEmbInitializerArgs):
        raise TypeError(
            f"{owner}: initializer_args must be a DynamicEmbInitializerArgs or None, got {args!r}"
        )


def _initializer_key(args: DynamicEmbInitializerArgs | None):
    """What tables sharing an admitter must agree on about its initializer:
    whether there is one, and its mode (the parameters are per table)."""
    return None if args is None else args.mode


def _initializer(strategies: Sequence["AdmissionStrategy"]) -> MultiTableInitializer | None:
    """The rejected-row initializer of these tables, or None for the tables'
    own (grouping made them agree on whether there is one)."""
    if strategies[0].initializer_args is None:
        return None
    return MultiTableInitializer([s.initializer_args for s in strategies])


def _check_strategies(cls: type, table_strategies: Sequence[Any]) -> list:
    """The strategies of the tables of one admitter: of ``cls``, agreeing on
    ``get_grouped_key``."""
    strategies = list(table_strategies)
    if not strategies:
        raise ValueError(f"{cls.__name__}.create_admitter needs one strategy per table, got []")
    for t, s in enumerate(strategies):
        if not isinstance(s, cls):
            raise TypeError(
                f"{cls.__name__}.create_admitter: the strategy of table {t} is {s!r}, not a "
                f"{cls.__name__}"
            )
    keys = [s.get_grouped_key() for s in strategies]
    for t, k in enumerate(keys):
        if k != keys[0]:
            raise ValueError(
                f"{cls.__name__}.create_admitter: tables 0 and {t} disagree on what one admitter "
                f"shares: {strategies[0]!r} vs {strategies[t]!r}"
            )
    return strategies


class FrequencyAdmissionStrategy(AdmissionStrategy):
    """Admits a missing key once it has been seen ``threshold`` times.

    A key's count accumulates, over training batches, the occurrences of the
    key while it is missing from its table, this batch's included; the key is
    admitted in the batch its count reaches ``threshold`` and is erased from
    the counter at that moment. The count lives in ``counter``, a table's
    share of a bucketized counter that evicts its smallest count when a bucket
    is full, so a key waiting too long among many may start over.

    Args:
        threshold (int): the count that admits, >= 0 (0 and 1 admit every key
            at once).
        counter (Optional[KVCounter]): this table's share of the counter;
            None for ``DEFAULT_KV_COUNTER`` (2**20 slots).
        initializer_args (Optional[DynamicEmbInitializerArgs]): how the rows of
            rejected keys are initialized; None for the table's own
            ``initializer_args`` (the only way to get UNIFORM or
            TRUNCATED_NORMAL bounds derived from the table's row count: unset
            bounds here are completed without it, ``complete_initializer_args``).

    Raises:
        ValueError: a negative threshold, or a counter whose bucket_capacity is
            not a multiple of 16 (named).
        TypeError: a threshold that is not an int, a counter that is not a
            KVCounter, initializer_args that are not DynamicEmbInitializerArgs
            (each named).

    Example::

        FrequencyAdmissionStrategy(threshold=4, counter=KVCounter(capacity=1 << 20))
    """

    def __init__(
        self,
        threshold: int,
        counter: KVCounter | None = None,
        initializer_args: DynamicEmbInitializerArgs | None = None,
    ) -> None:
        threshold = as_int(threshold, "FrequencyAdmissionStrategy: threshold")
        if threshold < 0:
            raise ValueError(
                f"FrequencyAdmissionStrategy: threshold must be non-negative, got {threshold}"
            )
        if counter is not None:
            if not isinstance(counter, KVCounter):
                raise TypeError(
                    "FrequencyAdmissionStrategy: counter must be a KVCounter or None, got "
                    f"{counter!r}"
                )
            check_kv_counter(counter, "FrequencyAdmissionStrategy")
        _check_initializer_args("FrequencyAdmissionStrategy", initializer_args)
        self.threshold = threshold
        self.counter = counter
        self.initializer_args = initializer_args

    @property
    def kv_counter(self) -> KVCounter:
        """The counter share in effect: ``counter``, or ``DEFAULT_KV_COUNTER``."""
        return DEFAULT_KV_COUNTER if self.counter is None else self.counter

    @classmethod
    def create_admitter(
        cls,
        table_strategies: list[AdmissionStrategy],
        device: torch.device,
    ) -> MultiTableFrequencyAdmitter:
        """One fused ``MultiTableKVCounter`` from the tables' counter shares,
        and the admitter counting into it."""
        strategies = _check_strategies(cls, table_strategies)
        counter = MultiTableKVCounter([s.kv_counter for s in strategies], device)
        return MultiTableFrequencyAdmitter(
            cls.one_configuration(strategies).threshold, counter, _initializer(strategies)
        )

    def get_grouped_key(self):
        """The threshold, the counter's key type, and whether rejected rows
        have an initializer of their own and its mode; capacities, bucket
        widths and initializer parameters are per table."""
        return (
            "frequency",
            self.threshold,
            self.kv_counter.key_type,
            _initializer_key(self.initializer_args),
        )

    def state_bytes(self) -> int:
        """Bytes of the table's counter share: a counter table of its slots,
        in whole buckets, with one score word (what ``MultiTableKVCounter``
        allocates per table)."""
        from dynamicemb.storage import table_metadata_bytes

        return table_metadata_bytes([counter_layout(self.kv_counter)[0]], 1, [0])

    def with_deprecated_counter(self, counter) -> "FrequencyAdmissionStrategy":
        if self.counter is None:
            return FrequencyAdmissionStrategy(self.threshold, counter, self.initializer_args)
        if self.counter == counter:
            return self
        raise ValueError(
            "DynamicEmbTableOptions: admission_counter (deprecated) is "
            f"{counter!r}, but its admit_strategy counts into {self.counter!r}; "
            "set the counter on the strategy only"
        )

    def __repr__(self) -> str:
        return (
            f"FrequencyAdmissionStrategy(threshold={self.threshold!r}, counter={self.counter!r}, "
            f"initializer_args={self.initializer_args!r})"
        )


class ProbabilisticAdmissionStrategy(AdmissionStrategy):
    """Admits a missing key by a coin toss per occurrence.

    Admission is consulted only for a key that is missing, so a key gets a
    fresh toss every time it turns up and is not yet in the table: it takes
    ``1 / probability`` appearances on average to get in. A batch holding a
    key k times counts as k tosses. No state is kept: ``state()`` is None.

    The tosses come from a generator the admitter owns, seeded when the
    module is built with ``torch.initial_seed()``: after ``torch.manual_seed``
    a run repeats, and admission does not move the global random stream.

    Args:
        probability (float): chance of one toss to admit, in (0, 1].
        initializer_args (Optional[DynamicEmbInitializerArgs]): as for
            ``FrequencyAdmissionStrategy``.

    Raises:
        ValueError: a probability outside (0, 1] (named).
        TypeError: a probability that is not a real number, or bad
            initializer_args (named).
    """

    def __init__(
        self,
        probability: float,
        initializer_args: DynamicEmbInitializerArgs | None = None,
    ) -> None:
        if not isinstance(probability, (int, float)) or isinstance(probability, bool):
            raise TypeError(
                f"ProbabilisticAdmissionStrategy: probability must be a real number, got "
                f"{probability!r}"
            )
        if not (0.0 < probability <= 1.0) or math.isnan(probability):
            raise ValueError(
                "ProbabilisticAdmissionStrategy: probability must be in (0, 1], got "
                f"{probability!r}"
            )
        _check_initializer_args("ProbabilisticAdmissionStrategy", initializer_args)
        self.probability = float(probability)
        self.initializer_args = initializer_args

    @classmethod
    def create_admitter(
        cls,
        table_strategies: list[AdmissionStrategy],
        device: torch.device,
    ) -> MultiTableProbabilisticAdmitter:
        strategies = _check_strategies(cls, table_strategies)
        return MultiTableProbabilisticAdmitter(
            cls.one_configuration(strategies).probability,
            device,
            torch.initial_seed(),
            _initializer(strategies),
        )

    def get_grouped_key(self):
        """The probability, and whether rejected rows have an initializer of
        their own and its mode."""
        return ("probability", self.probability, _initializer_key(self.initializer_args))

    def __repr__(self) -> str:
        return (
            f"ProbabilisticAdmissionStrategy(probability={self.probability!r}, "
            f"initializer_args={self.initializer_args!r})"
        )
