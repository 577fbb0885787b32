"""The faces of a storage: what each caller asks of where rows live.

A storage tier implements the faces its callers need and names them in its
class line; a caller asks for the face it needs, and an operation a tier does
not offer is refused by the tier's type (``isinstance``), never by a method
that raises. Each face is a small abstract class of a few methods:

===============  =============================================  ==========================
face             asked by                                       implemented by
===============  =============================================  ==========================
``StepRows``     the embedding module's forward and backward    every ``TableStorage``
``CacheControl`` the module's prefetch, flush and purge         every ``TableStorage``
``Archive``      checkpoints (``TableRows``), a cache of its    every ``TableStorage``, every
                 backing                                        ``Backing``
``Accounting``   metrics, the module's memory figures, a cache  every ``TableStorage``, every
                 of its backing                                 ``Backing``
``HashTier``     metrics' counters, the clock of TIMESTAMP      ``HashTableStorage``,
                 scores                                         ``CachedHashStorage``
``DeltaRows``    incremental dumps and replays (``TableRows``)  ``HashTableStorage``,
                                                                ``CachedHashStorage``
``Backing``      a cache, of the tier below it                  ``HashTableStorage``,
                                                                ``ExternalBacking``
``HostBacking``  a cache whose kernels address the rows of the  ``HashTableStorage``
                 tier below in place
===============  =============================================  ==========================

``TableStorage`` is what the embedding module holds: ``StepRows``,
``CacheControl``, ``Archive`` and ``Accounting``. An external ``Storage`` is
neither a ``HashTier`` nor ``DeltaRows``: the operations of those faces are
refused for it by type (docs/storage.md). A storage's CUDA-graph hooks are not
a face of its own but one companion object, ``StepGraphs`` (``graphs``).

Keys given to one call are distinct per table. A row is addressed, for the
pooling kernels, by a byte offset into the storage's row space (``space()``);
an offset is valid until the next call that changes the storage
(``train_rows``, ``eval_rows``, ``prefetch``, ``flush``, ``purge``,
expansion and the ``Archive`` and ``DeltaRows`` calls).
"""

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb.storage.host_writes import HostWrites
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.scores import BatchScore
from dynamicemb.table import ScoredHashTable
from dynamicemb.types import MemoryType

# StepRows.train_rows' row of a key its table refused (``refuse_cold_keys``):
# stored nowhere, like -1, but not a failure; the module gives it a fill row.
# Far below the fill rows' references (-2 - i, cc/embedding/pooling.h).
REFUSED_ROW = -(2**62)

# ------------------------------------------------------------------- rows --


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
        embeddings (torch.Tensor): (n, dim) at the table's embedding dtype
            (FP8: (n, embedding bytes) uint8, the rows' codes and scale:
            ``dynamicemb.io.embeddings.columns``).
        optimizer_state (torch.Tensor, optional): (n, state_dim) float32;
            None when the rows carry no optimizer state.
        slots (torch.Tensor, optional): (n) int64, each key's slot in its
            table of the hash tier (0 .. capacity - 1), where a replay by
            slot writes it (``DeltaRows.export_changed``).
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


def by_memory(f: Footprint, mem_type: MemoryType, device: torch.device) -> int:
    """The bytes of a footprint in ``mem_type`` memory on ``device`` (a CPU
    device's tiers are all host memory)."""
    if not isinstance(mem_type, MemoryType):
        raise ValueError(f"mem_type must be a MemoryType, got {mem_type!r}")
    if device.type == "cpu":
        return f.device + f.host if mem_type == MemoryType.HOST else 0
    return f.device if mem_type == MemoryType.DEVICE else f.host


# ---------------------------------------------------------- CUDA graphs --


def _nothing(*args) -> None:
    return None


@dataclass(frozen=True)
class StepGraphs:
    """A storage's companion for CUDA graphs of the module's steps
    (``dynamicemb.embedding.cuda_graphs``): what a graph of a padded training
    lookup or prefetch captures of the storage and what the host does around
    a capture or a replay. The default is a storage none of whose steps may
    be captured.

    Attributes:
        state: ``() -> tuple | None``: what a graph of a padded training
            batch's ``train_rows`` would capture of the storage (the addresses
            of its state tensors and the sizes its kernels take), or None
            when its ``train_rows`` synchronizes or changes its layout (a
            graph replays only an unchanged state: docs/architecture.md, "A
            training step that never waits for the device").
        before_lookup: ``() -> None``, before a training lookup is captured or
            replayed: what ``train_rows`` does on the host before its kernels
            and cannot do inside a capture (wait for a prefetch on another
            stream, finish a batch that had no backward).
        lookup_state: ``() -> Any``, after a capture: what the captured
            ``train_rows`` set on the host (the graph's own tensors), which
            each replay puts back (``replayed``).
        replayed: ``(state) -> None``, after a replay: puts back
            ``lookup_state``'s ``state``, as if ``train_rows`` had run.
        prefetch_state: ``() -> tuple | None``: what a graph of
            ``prefetch_rows`` (a padded prefetch's kernels) would capture, or
            None when a prefetch may not be captured (then
            ``before_prefetch``, ``prefetch_rows`` and ``after_prefetch`` are
            never called).
        before_prefetch: ``() -> None``, before a prefetch's kernels are
            captured or replayed: what ``prefetch`` does on the host first.
        prefetch_rows: ``(keys, tids) -> None``: ``prefetch``'s kernels,
            reading nothing on the host.
        after_prefetch: ``(taken) -> None``, after a prefetch's kernels ran
            from a graph (``taken``: ``prefetch_taken``'s): what ``prefetch``
            does on the host last.
        prefetch_taken: ``() -> Any``, after a prefetch is captured: what the
            captured ``prefetch_rows`` left for the host to do after its
            kernels (the graph's own tensors), which each replay passes to
            ``after_prefetch``.
    """

    state: Callable[[], tuple | None] = _nothing
    before_lookup: Callable[[], None] = _nothing
    lookup_state: Callable[[], Any] = _nothing
    replayed: Callable[[Any], None] = _nothing
    prefetch_state: Callable[[], tuple | None] = _nothing
    before_prefetch: Callable[[], None] = _nothing
    prefetch_rows: Callable[[torch.Tensor, torch.Tensor], None] = _nothing
    after_prefetch: Callable[[Any], None] = _nothing
    prefetch_taken: Callable[[], Any] = _nothing


# ---------------------------------------------------------------- faces --


class StepRows(abc.ABC):
    """The rows of a training or eval step: find-or-insert, find, the row
    space the pooling and update kernels address, and the write-back after
    the update.

    Attributes:
        layout (RowLayout): the tables' row format.
        device (torch.device): the device the module computes on.
        graphs (StepGraphs): the companion for CUDA graphs of the steps.
    """

    layout: RowLayout
    device: torch.device
    graphs: StepGraphs = StepGraphs()
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

    def key_table(self) -> ScoredHashTable | None:
        """The ``ScoredHashTable`` holding exactly the keys ``contains``
        reports, on the module's device, so that admission can look its keys
        up in its own op (``counter_admit``); None when the keys are not in
        one table (a cache over a backing tier, an external storage)."""
        return None

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
            stored (it reads zeros and is not updated), ``REFUSED_ROW`` where
            the table refused a new key (``refuse_cold_keys``).
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


class CacheControl(abc.ABC):
    """The device cache between steps (no-ops for a storage without one)."""

    @abc.abstractmethod
    def prefetch(self, keys: torch.Tensor, tids: torch.Tensor, forward_stream=None) -> None:
        """Brings stored keys of a coming batch into the device cache."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Writes cached rows back to the backing tier."""

    @abc.abstractmethod
    def purge(self) -> None:
        """Flushes, then empties the cache."""


class Archive(abc.ABC):
    """Every row of a table, out and in: what a checkpoint dumps and loads."""

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


class Accounting(abc.ABC):
    """What the tables hold and what they let go: bytes by tier and table,
    keys and capacities per table, the keys the last tier evicted."""

    device: torch.device

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
    def capacity(self, table: int) -> int:
        """Slots of ``table``'s key map in the last tier now (an external
        storage: the keys it can hold, its ``Storage.capacity``)."""

    @abc.abstractmethod
    def limit(self, table: int) -> int:
        """Rows ``table`` can hold now (NO_EVICTION: its value rows; else its
        slots; an external storage: its ``Storage.capacity``)."""

    @abc.abstractmethod
    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Per table, the keys the last tier evicted since the last call
        (``evicted_item_mode=RETAIN_KEY``; empty otherwise), each once. With
        ``tables``, only those are popped (the others keep theirs and read
        empty here)."""


class TableStorage(StepRows, CacheControl, Archive, Accounting):
    """Where the rows of a module's tables live: everything
    ``BatchedDynamicEmbeddingTablesV2`` knows of it (see the module
    docstring)."""


class HashTier(abc.ABC):
    """A storage whose every key a dynamicemb hash table holds (its last
    tier): that table, whose device counters and capacities metrics read and
    whose clock TIMESTAMP scores come from."""

    @property
    @abc.abstractmethod
    def hash_table(self) -> ScoredHashTable:
        """The ``ScoredHashTable`` of the last tier (read as it is: a cache
        over it is not written back first)."""


class DeltaRows(HashTier):
    """Rows by slot and by score in the hash table holding every key: what
    incremental dumps read and replays write.

    Before its reads a caller calls ``settle(writing=False)``, before its
    writes ``settle(writing=True)``: the other tiers then agree with the hash
    table (a cache written back, and emptied before a write, so that no cached
    copy hides what is written; a hybrid table's staged batch finished).
    Score words are in the table's internal column order.
    """

    @abc.abstractmethod
    def settle(self, writing: bool) -> None:
        """Brings the hash table up to date with the other tiers (see the
        class docstring)."""

    @abc.abstractmethod
    def export_changed(
        self, table: int, chunk: int, column: int, threshold: int
    ) -> Iterator[ExportedRows]:
        """The keys of ``table`` whose score word ``column`` is at least
        ``threshold``, with their rows, slots (in the table) and score words,
        ``chunk`` slots scanned at a time."""

    @abc.abstractmethod
    def check_place(self, table: int, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Raises what ``place`` would for these keys and slots (0 ..
        capacity - 1 of ``table``), changing nothing."""

    @abc.abstractmethod
    def place(self, table: int, keys, slots, words, embeddings, optimizer_state, init, checked):
        """Keys with their rows at the given slots of ``table`` (0 ..
        capacity - 1), score words ``words`` (NO_EVICTION: the rows). Returns
        the table's ``InsertResult`` (``evicted``: the keys displaced)."""

    @abc.abstractmethod
    def upsert(self, table: int, keys, words, embeddings, optimizer_state, init):
        """Keys with their rows in ``table`` by key: updated where held,
        inserted (expanding first, evicting from full buckets, recorded under
        RETAIN_KEY) where not. ``words``: score words (None under
        NO_EVICTION). Returns ``(slots, status, evicted)``."""

    @abc.abstractmethod
    def erase(self, table: int, keys: torch.Tensor, record: bool) -> torch.Tensor:
        """Removes keys from ``table``; with ``record`` the keys removed are
        kept for ``pop_erased``. Returns the (n) bool mask of the keys that
        were held."""

    @abc.abstractmethod
    def pop_erased(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """The keys ``erase(record=True)`` removed since the last call, per
        table (in erase order); clears them (only ``tables``, if given)."""


class Backing(Archive, Accounting):
    """What a device cache asks of the tier below it (``CachedStorage``):
    which keys it holds and their rows, room for the keys the cache will
    write back, and the write-back itself; and, for the whole storage, its
    ``Archive`` and ``Accounting``.

    Attributes:
        has_scores (bool): whether keys carry scores between this tier and a
            cache (``locate`` and ``fetch`` return them).
        strategies (tuple or None): the score strategy of those scores.
        can_fail (bool): whether a call may raise midway (a user's
            ``Storage``): the cache then keeps what it needs to put a failed
            step back (docs/storage.md, "A storage that raises").
    """

    has_scores: bool
    strategies: tuple | None
    can_fail: bool = False

    @abc.abstractmethod
    def contains(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """(n) bool: the tier holds the key."""

    @abc.abstractmethod
    def fetch(self, keys: torch.Tensor, tids: torch.Tensor):
        """The rows of keys the tier holds, copied: ``(found (n) bool,
        staging rows (n, max_row_bytes), scores (n, num_scores) or None)``."""

    @abc.abstractmethod
    def locate(self, keys: torch.Tensor, tids: torch.Tensor):
        """Where the rows of keys the tier holds are, for a cache to copy
        them from: ``(found (n) bool, a row space, (n) byte offsets (-1 where
        not held), scores (n, num_scores) or None)``. The offsets hold until
        the tier changes."""

    @abc.abstractmethod
    def expand_for(self, keys: torch.Tensor, tids: torch.Tensor) -> None:
        """Makes room for ``keys`` (those not held yet), before a
        ``write_back`` of them with ``expand=False``."""

    @abc.abstractmethod
    def room_for(self, tids: torch.Tensor, valid: torch.Tensor | None = None) -> list[int] | None:
        """Keys per table to ``reserve`` for one more key per entry of
        ``tids`` (with ``valid``, per entry it marks), read to the host; None
        when the tier sizes itself or cannot grow (then nothing is read)."""

    @abc.abstractmethod
    def reserve(self, incoming: Sequence[int]) -> None:
        """Expands the tables that ``incoming[t]`` new keys could overfill
        (a ``room_for`` result)."""

    @abc.abstractmethod
    def write_back(
        self, keys, tids, src, src_offsets, scores, protect=None, expand: bool = True, before=None
    ) -> None:
        """Stores rows a cache gives back (from the row space ``src`` at
        ``src_offsets``), with their scores where ``has_scores``. ``PAD_KEY``
        entries are left out. ``protect``: ``(keys, table ids, scores)`` of
        keys a ``locate`` found whose rows are still to be read (no key
        written back evicts them). ``before``: for a tier that ``can_fail``,
        ``(found (n) bool, staging rows)``, what the keys were before, put
        back when a write fails midway."""


class HostBacking(Backing):
    """A backing tier whose rows the cache's kernels address in place (a host
    hash table's pinned, mapped rows): the keys a cache cannot take are found
    or inserted there, and a step reads nothing on the host.

    Its ``write_back`` also takes ``staged=True`` (and ``count``, the
    entries with a row: a valid prefix): the rows are gathered into device
    memory at once and written to the host rows off the step's stream
    (``writes``), so that the cache may reuse their slots at once.

    Attributes:
        dropped (torch.Tensor): () int64 on the device, keys a write-back
            could not place (their bucket full of keys it protects).
        graphs (StepGraphs): its ``state`` is part of what a CUDA graph of the
            cache's step captures.
        writes (HostWrites): the rows on their way to its host rows
            (dynamicemb/storage/host_writes.py), which every reader or
            writer of them waits for first.
    """

    dropped: torch.Tensor
    graphs: StepGraphs
    writes: HostWrites

    @abc.abstractmethod
    def drop_moved_writes(self) -> None:
        """Drops the staged rows whose slot another key took since they were
        staged (``HostWrites.drop_moved``)."""

    @abc.abstractmethod
    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tier's row space (its second segment: the host rows)."""

    @abc.abstractmethod
    def insert_rows(
        self, keys, tids, counts, score: BatchScore, init: RowInit, expand: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training find-or-insert by the tier's own score strategy, new keys'
        rows written: ``(slots, offsets)``, -1 where not stored."""

    @abc.abstractmethod
    def scores_at(self, slots: torch.Tensor) -> torch.Tensor:
        """(n, num_scores) score words of the keys at ``slots`` (entries at
        -1 read slot 0's: the caller selects the valid ones)."""
