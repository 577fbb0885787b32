"""Pluggable interfaces of dynamicemb and the small types they speak in.

This is the leaf module of the package: it imports nothing from dynamicemb, so
every other module (``dynamicemb_config`` first of all) can import from it
without a cycle.

What lives here:

* ``MemoryType`` and ``EvictedItemMode``: small enums the interfaces below
  (and the table options) are written in.
* ``Counter``: a key -> accumulated-count table an admission strategy owns.
* ``KVCounter``: the configuration of dynamicemb's own counter (it is not a
  ``Counter``; a module turns it into one).
* ``AdmissionStrategy`` / ``MultiTableAdmitter``: admission configuration and
  the object that decides.
* ``Storage``: the interface an external storage (parameter server, key-value
  store) implements to hold a table's rows, and ``StorageTable``, what it is
  told about each table it serves.
* ``ReplayStats``: what ``replay_increment`` did to one table.

Implementations live in plural-named modules elsewhere in the package.
"""

import abc
import enum
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = [
    "AdmissionStrategy",
    "Counter",
    "EvictedItemMode",
    "KVCounter",
    "MemoryType",
    "MultiTableAdmitter",
    "ReplayStats",
    "Storage",
    "StorageTable",
]


@enum.unique
class MemoryType(enum.Enum):
    """Kind of memory a component reports its consumption of.

    Attributes:
        DEVICE (str): accelerator memory (HBM on a GPU).
        HOST (str): host memory (pinned or pageable), including host memory
            mapped for device access.
    """

    DEVICE = "device"
    HOST = "host"


@enum.unique
class EvictedItemMode(enum.IntEnum):
    """What storage does with a key it removes.

    Used as a table option (``DynamicEmbTableOptions.evicted_item_mode``: what
    the last storage tier does with the keys it evicts) and per erase call
    (whether the keys an explicit erase removes are recorded). It is an
    ``IntEnum`` because it selects a kernel variant and is handed to the
    kernels as an integer.

    Attributes:
        DISCARD (int): drop removed keys; no overhead.
        RETAIN_KEY (int): record the removed (key, table id) pairs, keys only,
            no value and no score, so they can be read back later
            (``pop_evicted_keys`` / ``pop_erased_keys``).
    """

    DISCARD = 0
    RETAIN_KEY = 1


@dataclass
class ReplayStats:
    """What a replay (``replay_increment``) did to one table on this rank.

    Attributes:
        upserted (int): delta keys written (at their source slot, or by key in
            this table's own layout).
        erased (int): keys actually removed before the writes (a delta can
            name keys this replica never held).
        skipped (int): delta keys this rank does not own.
        displaced (int): replay by key only: keys this table could not keep
            for lack of room (keys it held and evicted, delta keys it could
            not place). Non-zero means the replica is too small to follow its
            source exactly.
    """

    upserted: int = 0
    erased: int = 0
    skipped: int = 0
    displaced: int = 0


class Counter(abc.ABC):
    """Interface of a counter table which maps a key to a counter.

    A strategy that admits by frequency owns one. The framework only carries
    it: it reports its memory and writes it into checkpoints, which is what
    ``MultiTableAdmitter.state()`` hands over. Custom counters inherit this
    class.
    """

    @abc.abstractmethod
    def add(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        frequencies: torch.Tensor,
    ) -> torch.Tensor:
        """Add frequencies to these keys and return their accumulated counts.

        Args:
            keys (torch.Tensor): ``(n,)`` keys.
            table_ids (torch.Tensor): ``(n,)`` logical table of each key.
            frequencies (torch.Tensor): ``(n,)`` increment for each key.

        Returns:
            torch.Tensor: ``(n,)`` count of each key after the increment.
        """

    @abc.abstractmethod
    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        """Erase these keys.

        Args:
            keys (torch.Tensor): ``(n,)`` keys.
            table_ids (torch.Tensor): ``(n,)`` logical table of each key.
        """

    @abc.abstractmethod
    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Consumption of one kind of memory.

        Args:
            mem_type (MemoryType): which memory to report.

        Returns:
            int: bytes of ``mem_type`` memory this counter holds.
        """

    @abc.abstractmethod
    def load(self, key_file, counter_file, table_id: int) -> None:
        """Load one table's keys and counts from these files.

        Args:
            key_file: file (path or open binary file) holding the keys.
            counter_file: file holding the count of each key, in key order.
            table_id (int): the logical table to load into.
        """

    @abc.abstractmethod
    def dump(self, key_file, counter_file, table_id: int) -> None:
        """Dump one table's keys and counts to these files.

        Args:
            key_file: file (path or open binary file) to write the keys to.
            counter_file: file to write the count of each key to, in key order.
            table_id (int): the logical table to dump.
        """


@dataclass(frozen=True)
class KVCounter:
    """Size of one table's share of dynamicemb's bucketized counter.

    This is configuration, not a ``Counter``: the admission strategy holding
    it turns the shares of the tables it serves into one fused multi-table
    counter when a module materializes it. A full bucket evicts its
    smallest-frequency key to make room, so size ``capacity`` for the keys
    still waiting to be admitted rather than for the embedding table.

    Frozen, so equal configurations compare and hash equal and can take part
    in an admission strategy's grouped key.

    Attributes:
        capacity (int): counter slots for this table (on each rank of a
            sharded table, like ``max_capacity``). Must be positive. The
            counter follows the table's bucket rules: it rounds the capacity
            up to whole buckets of ``bucket_capacity``, and a capacity
            smaller than a bucket is one bucket of that capacity (rounded up
            to a multiple of ``BUCKET_ALIGNMENT``, 16): ``KVCounter(100)`` is
            one bucket of 112 slots.
        bucket_capacity (int): slots per bucket. Must be positive; the
            counter also needs a multiple of ``BUCKET_ALIGNMENT`` (16), which
            ``FrequencyAdmissionStrategy`` checks. Defaults to 1024.
        key_type (torch.dtype): dtype of the counted keys; an integer dtype.
            Defaults to ``torch.int64``.
    """

    capacity: int
    bucket_capacity: int = 1024
    key_type: torch.dtype = torch.int64

    def __post_init__(self) -> None:
        if not _is_int(self.capacity) or self.capacity <= 0:
            raise ValueError(f"KVCounter.capacity must be a positive int, got {self.capacity!r}")
        if not _is_int(self.bucket_capacity) or self.bucket_capacity <= 0:
            raise ValueError(
                f"KVCounter.bucket_capacity must be a positive int, got {self.bucket_capacity!r}"
            )
        if (
            not isinstance(self.key_type, torch.dtype)
            or self.key_type.is_floating_point
            or self.key_type.is_complex
            or self.key_type == torch.bool
        ):
            raise ValueError(
                f"KVCounter.key_type must be an integer torch.dtype, got {self.key_type!r}"
            )


class MultiTableAdmitter(abc.ABC):
    """What a module runs to decide admission for the tables it fuses.

    Holds everything deciding takes. Only ``admit`` has to be implemented; the
    other two have defaults, so an admitter that merely decides is one method.
    """

    @abc.abstractmethod
    def admit(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        frequencies: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Which of these missing keys may enter the table.

        Args:
            keys (torch.Tensor): ``(n,)`` keys not found in their table.
            table_ids (torch.Tensor): ``(n,)`` logical table of each key.
            frequencies (Optional[torch.Tensor]): ``(n,)`` how often each key
                occurred in *this batch*, where the module counts occurrences
                at all; None means treat each key as one. It is an increment,
                not a running total: any total is the admitter's own to keep.

        Returns:
            torch.Tensor: ``(n,)`` bool, True where the key is admitted.
        """

    def state(self) -> Counter | None:
        """Persistent state the framework has to carry, or None.

        Whatever an admitter accumulates across steps has to be reported in
        memory accounting and survive a checkpoint. Return it here and the
        framework does both.
        """
        return None

    @property
    def non_admitted_initializer(self):
        """What writes the rows this admitter rejects, or None for the table's.

        A rejected key still takes part in the forward, so its row has to be
        written by something. Return a multi-table initializer to take that
        on; the module does the calling.
        """
        return None


class AdmissionStrategy(abc.ABC):
    """Admission configuration of a table.

    Inert: it allocates nothing, touches no device, may be given to as many
    tables as you like, and decides nothing. A fused module turns the
    configurations of the tables it fuses into the one thing that decides by
    calling ``create_admitter``, which is where anything device-side comes
    into being.
    """

    @classmethod
    @abc.abstractmethod
    def create_admitter(
        cls,
        table_strategies: list["AdmissionStrategy"],
        device: torch.device,
    ) -> MultiTableAdmitter:
        """The admitter these tables share, with its device state allocated.

        Called once, by the module, with one configuration per table it fuses.

        Args:
            table_strategies (List[AdmissionStrategy]): one configuration per
                fused table, in table-id order.
            device (torch.device): where the admitter's state lives.

        Returns:
            MultiTableAdmitter: the admitter of the fused tables.
        """

    @classmethod
    def one_configuration(cls, table_strategies: list["AdmissionStrategy"]) -> "AdmissionStrategy":
        """The single configuration these tables agree on.

        They were grouped on ``get_grouped_key``, so they are already
        interchangeable and the first stands for all.

        Args:
            table_strategies (List[AdmissionStrategy]): one per fused table.

        Returns:
            AdmissionStrategy: the first of them.

        Raises:
            ValueError: ``table_strategies`` is empty.
        """
        if not table_strategies:
            raise ValueError(
                f"{cls.__name__}.one_configuration needs at least one strategy, "
                f"got {table_strategies!r}"
            )
        return table_strategies[0]

    def get_grouped_key(self):
        """What has to match for two tables to share one fused module.

        The default is the instance itself, so only the same object groups.
        Override it to let equal but separately constructed configurations
        share a module, returning everything that changes the decision and,
        for what is resolved per table, only what the tables must agree on.
        The result must be hashable.
        """
        return self

    def state_bytes(self) -> int:
        """Bytes of admission state the admitter keeps for one table.

        What a table's memory estimate (``dynamic_shard_storage``) adds, on
        the table's device: a counter's slots for a strategy that counts, 0 (the default)
        for one that keeps no state across steps.
        """
        return 0

    def with_deprecated_counter(self, counter) -> "AdmissionStrategy | None":
        """This strategy counting into ``counter``, or None if it counts nothing.

        How ``DynamicEmbTableOptions.admission_counter`` (deprecated) is
        carried to the strategy that uses it. The default: nothing counts, so
        the field has no effect.
        """
        return None


@dataclass(frozen=True)
class StorageTable:
    """What an external ``Storage`` is told about one logical table it serves.

    Attributes:
        embedding_dim (int): embedding width, in elements.
        value_dim (int): row width: the embedding, then the optimizer state
            (float32 elements, 0 without an optimizer).
        embedding_dtype (torch.dtype): the precision the table stores its
            embeddings at (float32, float16 or bfloat16).
        capacity (int): rows of the table on this rank (its ``max_capacity``).
        num_scores (int): score words per key.
    """

    embedding_dim: int
    value_dim: int
    embedding_dtype: torch.dtype
    capacity: int
    num_scores: int


class Storage(abc.ABC):
    """Interface of an external storage holding the rows of dynamic tables.

    A table normally keeps its rows in dynamicemb's own hash table. Setting
    ``DynamicEmbTableOptions.external_storage`` to a subclass of this class
    makes the table keep them in that storage instead (a parameter server, a
    key-value store, a Python dict in a test). The option takes the class, not
    an instance: the module that materializes the tables constructs it as
    ``cls(tables, device)``, ``tables`` a list of ``StorageTable`` (one per
    logical table, in table-id order) and ``device`` the module's device, and
    checks it against this contract (the row format it reports, the types and
    shapes it returns), refusing a subclass that breaks it with an error
    naming the class and the method. With ``caching=True`` a device cache
    sits in front of it; otherwise each batch's rows are read from it and
    written back after the update.

    One instance may serve several logical tables fused in one module, so
    every operation takes the logical table of each key (``table_ids``). Rows
    cross the interface as float32 ``(n, value_dim(table_id))`` tensors: the
    embedding (exact in float32 whatever ``embedding_dtype``), then the
    optimizer state; the storage may keep them at any precision that gives
    back the embedding at ``embedding_dtype``. Scores are ``num_scores`` int64
    words per key, in the table's configured score order; rows given back by
    the cache come without scores (the storage scores them).

    Operations on keys receive keys that are unique per table within one call,
    all of one table. Any call may raise: the training step (or prefetch)
    that made it fails whole, leaving the cache, the storage's rows as the
    module sees them and the module's step as they were before it.
    """

    @abc.abstractmethod
    def find(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """Look keys up and copy the rows of the found ones into ``values``.

        Args:
            keys (torch.Tensor): ``(n,)`` keys.
            table_ids (torch.Tensor): ``(n,)`` logical table of each key.
            values (torch.Tensor): ``(n, value_dim)`` float32 output on the
                module's device; row ``i`` is written only where key ``i`` is
                found.

        Returns:
            torch.Tensor: ``(n,)`` bool, True where the key was found.
        """

    @abc.abstractmethod
    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        values: torch.Tensor,
        scores: torch.Tensor | None = None,
    ) -> None:
        """Insert or overwrite rows.

        Args:
            keys (torch.Tensor): ``(n,)`` keys.
            table_ids (torch.Tensor): ``(n,)`` logical table of each key.
            values (torch.Tensor): ``(n, value_dim)`` float32 rows to store.
            scores (Optional[torch.Tensor]): ``(n, num_scores)`` scores to
                store with the rows; None lets the storage score them as it
                scores a fresh insert.
        """

    @abc.abstractmethod
    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        """Remove keys; keys that are not stored are ignored.

        Args:
            keys (torch.Tensor): ``(n,)`` the keys to remove.
            table_ids (torch.Tensor): ``(n,)`` the logical table of each.
        """

    @abc.abstractmethod
    def export_batches(
        self, table_id: int, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Iterate over everything one logical table stores, in batches.

        This is what a checkpoint dump reads; a load goes through ``insert``.

        Args:
            table_id (int): the logical table.
            batch_size (int): the most keys one batch holds.

        Yields:
            Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ``keys (m,)``,
            ``values (m, value_dim)`` and ``scores (m, num_scores)``.
        """

    @abc.abstractmethod
    def size(self, table_id: int) -> int:
        """Number of keys one logical table holds."""

    @abc.abstractmethod
    def capacity(self, table_id: int) -> int:
        """Number of keys one logical table can hold before it evicts."""

    @abc.abstractmethod
    def embedding_dim(self, table_id: int) -> int:
        """Embedding width of a logical table, in elements."""

    @abc.abstractmethod
    def value_dim(self, table_id: int) -> int:
        """Row width of a logical table (embedding + optimizer state)."""

    @abc.abstractmethod
    def embedding_dtype(self, table_id: int) -> torch.dtype:
        """Precision a logical table keeps its embeddings at."""

    @abc.abstractmethod
    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes of ``mem_type`` memory this storage holds."""


def _is_int(value) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
