"""The interface the embedding module reaches rows through.

``TableStorage`` is everything ``BatchedDynamicEmbeddingTablesV2`` knows about
where rows live. Keys given to one call are distinct per table. A row is
addressed, for the pooling kernels, by a byte offset into the storage's row
space (``space()``); an offset is valid until the next call that changes the
storage (``train_rows``, ``eval_rows``, ``prefetch``, ``flush``, ``purge``,
expansion and the checkpoint calls).
"""

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.scores import BatchScore
from dynamicemb.types import MemoryType


class RowInit(abc.ABC):
    """What a new row contains: the module's side of a row (initializers and
    the optimizer's initial state), called by the storage when it creates
    rows."""

    @abc.abstractmethod
    def embeddings(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(n, >= max dim) float32: the initial embedding of each key (only
        its table's dim leading columns are used)."""

    @abc.abstractmethod
    def init_state(self, state: torch.Tensor) -> None:
        """Writes the initial optimizer state into ``state`` ((n, state_dim)
        float32 rows of one dim)."""

    def write_rows(
        self,
        space: tuple[torch.Tensor, torch.Tensor],
        offsets: torch.Tensor,
        keys: torch.Tensor,
        tids: torch.Tensor,
        layout: RowLayout,
    ) -> bool:
        """Writes the new rows of ``keys`` straight into a row space at
        ``offsets`` (entries at -1 skipped), as ``embeddings`` and
        ``init_state`` would make them. Returns False when it cannot; the
        storage then builds the rows from ``embeddings`` and ``init_state``
        (which needs the new keys gathered first)."""
        return False


@dataclass
class ExportedRows:
    """Keys of one table with their rows (``export_rows``).

    Attributes:
        keys (torch.Tensor): (n) int64.
        scores (torch.Tensor, optional): (n, num_scores) int64 in
            ``score_strategy`` tuple order; None under NO_EVICTION.
        embeddings (torch.Tensor): (n, dim) at the table's embedding dtype.
        optimizer_state (torch.Tensor, optional): (n, state_dim) float32;
            None when the rows carry no optimizer state.
        slots (torch.Tensor, optional): (n) int64, each key's slot in its
            table of the hash tier (0 .. capacity - 1), where a replay by
            slot writes it (``HashTableStorage.export_changed``).
        words (torch.Tensor, optional): (n, num_scores) int64, the score words
            in the table's internal order (NO_EVICTION: word 0 is the row).
    """

    keys: torch.Tensor
    scores: torch.Tensor | None
    embeddings: torch.Tensor
    optimizer_state: torch.Tensor | None
    slots: torch.Tensor | None = None
    words: torch.Tensor | None = None


@dataclass(frozen=True)
class Footprint:
    """Bytes a storage holds, by tier: ``device`` (the device tier's rows and
    every hash table's metadata, which lives on the storage's device) and
    ``host`` (the host tier's rows). On a CPU storage both are host memory."""

    device: int
    host: int


class TableStorage(abc.ABC):
    """Where the rows of a module's tables live (see the module docstring).

    Attributes:
        layout (RowLayout): the tables' row format.
        device (torch.device): the device the module computes on.
    """

    layout: RowLayout
    device: torch.device
    # Whether the storage keeps a device cache; a cache tells
    # ``cache_observer(hit, miss, tids)``, when set, which of each lookup's
    # distinct keys it held and which it did not (padding is neither; ``tids``
    # grouped by table, as a lookup's distinct keys come:
    # dynamicemb.embedding.unique).
    has_cache: bool = False
    cache_observer = None
    # Whether ``train_rows`` takes padded batches (``num_keys``: the keys
    # past it are padding, see dynamicemb.embedding.unique), so that a
    # training step never reads the number of distinct keys on the host.
    takes_padded_batches: bool = False
    # Whether ``prefetch`` takes padded keys (``PAD_KEY`` entries), so that
    # the module need not read the number of distinct keys on the host.
    takes_padded_prefetch: bool = False

    def graph_state(self) -> tuple | None:
        """What a CUDA graph of a padded training batch's ``train_rows``
        would capture of this storage (the addresses of its state tensors and
        the sizes its kernels take), or None when its ``train_rows``
        synchronizes or changes its layout (a graph replays only an
        unchanged state: see docs/architecture.md, "A training step that
        never waits for the device")."""
        return None

    def before_graph_lookup(self) -> None:
        """Called before a training lookup is captured in a CUDA graph or
        replayed from one: what ``train_rows`` does on the host before its
        kernels and cannot do inside a capture (wait for a prefetch on another
        stream, finish a batch that had no backward)."""
        return None

    def graph_lookup_state(self):
        """After a capture: what the captured ``train_rows`` set on the host
        (the graph's own tensors), which each replay puts back
        (``graph_replayed``)."""
        return None

    def graph_replayed(self, state) -> None:
        """After a replay: puts back ``graph_lookup_state``'s ``state``, as if
        ``train_rows`` had run."""
        return None

    def prefetch_graph_state(self) -> tuple | None:
        """What a CUDA graph of ``prefetch_rows`` (a padded prefetch's kernels)
        would capture, or None when a prefetch may not be captured (then
        ``before_graph_prefetch``, ``prefetch_rows`` and
        ``after_graph_prefetch`` are never called)."""
        return None

    def before_graph_prefetch(self) -> None:
        """Before a prefetch's kernels are captured or replayed: what
        ``prefetch`` does on the host first (its stream ordering)."""
        raise NotImplementedError(type(self).__name__)

    def prefetch_rows(self, keys: torch.Tensor, tids: torch.Tensor) -> None:
        """``prefetch``'s kernels, reading nothing on the host."""
        raise NotImplementedError(type(self).__name__)

    def after_graph_prefetch(self) -> None:
        """After a prefetch's kernels ran from a graph: what ``prefetch`` does
        on the host last."""
        raise NotImplementedError(type(self).__name__)

    def key_table(self):
        """The ``ScoredHashTable`` holding exactly the keys ``contains``
        reports, on the module's device, so that admission can look its keys
        up in its own op (``counter_admit``); None when the keys are not in
        one table (a cache over a backing tier, an external storage)."""
        return None

    # ------------------------------------------------------------ lookups --

    @abc.abstractmethod
    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The row space's two segments, as the pooling kernels take them."""

    @abc.abstractmethod
    def train_rows(
        self,
        keys: torch.Tensor,
        tids: torch.Tensor,
        counts: torch.Tensor,
        score: BatchScore,
        init: RowInit,
        num_keys: torch.Tensor | None = None,
        lookup: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Training find-or-insert of distinct keys.

        A key already stored anywhere gets its row where the kernels can
        address it; a new key gets a row ``init`` writes. Scores follow the
        tables' strategy (``counts``: each key's LFU increment). ``num_keys``
        ((1) int64 on the device), given only to a storage that
        ``takes_padded_batches``: the keys from that position on are padding
        (``PAD_KEY``, count 0), which get -1 and change nothing. ``lookup``
        ((n) bool on the device), given with ``num_keys`` only: the entries
        to find or insert, padding excluded; the others (keys admission
        rejected) get -1 and change nothing, as padding does.

        Returns:
            torch.Tensor: (n) int64 byte offsets, -1 where a key could not be
            stored (it reads zeros and is not updated).
        """

    @abc.abstractmethod
    def eval_rows(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Rows of stored keys, changing nothing: (n) offsets, -1 for keys
        stored nowhere."""

    @abc.abstractmethod
    def contains(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(n) bool: the key is stored (in any tier)."""

    def read_rows(
        self, keys: torch.Tensor, tids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The rows of keys wherever they are stored, changing nothing:
        ``(found (n) bool, embeddings (n, max dim) float32, optimizer state
        (n, max state_dim) float32)``, zeros for keys stored nowhere."""
        from dynamicemb.storage import space as sp

        offsets = self.eval_rows(keys, tids)
        buf = sp.stage_rows(self.space(), offsets, tids, self.layout)
        emb, state = sp.unpack_rows(buf, tids, self.layout)
        return offsets >= 0, emb, state

    @abc.abstractmethod
    def after_update(self) -> None:
        """Called when the optimizer has updated the rows of the last
        ``train_rows``: rows kept outside the storage for that batch are
        written back."""

    # -------------------------------------------------------------- cache --

    @abc.abstractmethod
    def prefetch(self, keys: torch.Tensor, tids: torch.Tensor, forward_stream=None) -> None:
        """Brings stored keys of a coming batch into the device cache (no-op
        without a cache)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Writes cached rows back to the backing tier (no-op without cache)."""

    @abc.abstractmethod
    def purge(self) -> None:
        """Flushes, then empties the cache (no-op without cache)."""

    # -------------------------------------------------------- checkpoints --

    @abc.abstractmethod
    def export_rows(self, table: int, chunk: int) -> Iterator[ExportedRows]:
        """Every key ``table`` stores, with its row, ``chunk`` keys or fewer at
        a time (each key once, the newest row: a cached row over its
        backing copy)."""

    @abc.abstractmethod
    def import_rows(
        self,
        table: int,
        keys: torch.Tensor,
        scores: torch.Tensor | None,
        embeddings: torch.Tensor,
        optimizer_state: torch.Tensor | None,
        init: RowInit,
    ) -> torch.Tensor:
        """Stores keys of ``table`` with their rows (scores in ``score_strategy``
        tuple order, None under NO_EVICTION; ``optimizer_state`` None gives the
        initial state); nothing is evicted: a key whose home bucket is full
        fails. Returns (n) bool, the keys stored."""

    @abc.abstractmethod
    def clear_tables(self, tables: Sequence[int]) -> None:
        """Removes every key of ``tables`` from every tier."""

    @abc.abstractmethod
    def reserve_rows(self, table: int, incoming: int) -> None:
        """Expands ``table``'s last tier for ``incoming`` more keys, as a
        training insert would."""

    @abc.abstractmethod
    def snapshot(self):
        """A copy of everything ``import_rows``, ``clear_tables`` and
        ``reserve_rows`` may change (rows copied to host memory), for
        ``restore``; an external storage's own rows are not part of it."""

    @abc.abstractmethod
    def restore(self, snapshot) -> None:
        """Puts back the state ``snapshot`` copied."""

    # ---------------------------------------------------------- accounting --

    @abc.abstractmethod
    def footprint(self) -> Footprint:
        """Bytes held, by tier."""

    @abc.abstractmethod
    def footprint_per_table(self) -> list[Footprint]:
        """Bytes held for each table, by tier (they add up to ``footprint``;
        an external storage's own memory is not split by table)."""

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes of ``mem_type`` memory held (a CPU storage holds host memory
        only)."""
        return by_memory(self.footprint(), mem_type, self.device)

    def memory_per_table(self, mem_type: MemoryType = MemoryType.DEVICE) -> list[int]:
        """``memory_usage`` of each table."""
        return [by_memory(f, mem_type, self.device) for f in self.footprint_per_table()]

    @abc.abstractmethod
    def sizes(self) -> list[int]:
        """Keys stored per table (in any tier; reads the device)."""

    @abc.abstractmethod
    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Per table, the keys the last tier evicted since the last call
        (``evicted_item_mode=RETAIN_KEY``; empty otherwise), each once. With
        ``tables``, only those are popped (the others keep theirs and read
        empty here)."""

    # --------------------------------------------------------- replication --

    def hash_tier(self, writing: bool):
        """The ``HashTableStorage`` that holds every stored key of the tables
        (the last tier), once the other tiers agree with it: incremental
        dumps read rows, slots and scores there, replays write there.
        ``writing``: the other tiers are emptied, not only written back.

        Raises:
            NotImplementedError: the storage has no such table (an external
                storage).
        """
        raise NotImplementedError(
            f"{type(self).__name__} keeps its rows in no hash table dynamicemb owns: "
            "incremental dumps and replays are not supported for it"
        )


def by_memory(f: Footprint, mem_type: MemoryType, device: torch.device) -> int:
    """The bytes of a footprint in ``mem_type`` memory on ``device`` (a CPU
    device's tiers are all host memory)."""
    if not isinstance(mem_type, MemoryType):
        raise ValueError(f"mem_type must be a MemoryType, got {mem_type!r}")
    if device.type == "cpu":
        return f.device + f.host if mem_type == MemoryType.HOST else 0
    return f.device if mem_type == MemoryType.DEVICE else f.host
