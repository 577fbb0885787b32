"""``TableRows``: the rows of a module's fused tables, for the packages above it.

Checkpoints, replication and metrics reach a table's rows through this one
object, ``BatchedDynamicEmbeddingTablesV2.rows``, never through the training
module: it is built by the module from its storage, row layout and score
strategies, and reads the training step and the CUSTOMIZED scores from the
module through ``ScoreClock`` (the three names a clock has).

What it offers, one table at a time (optimizer state at ``state_dim``, the
width checkpoint files and deltas carry: rowwise Adagrad's one scalar of the
16 bytes its rows reserve; the rows take their own width too):

* checkpoints: keys, score columns in ``score_strategy`` order, embeddings (at
  ``embedding_dtype``) and optimizer state (float32) over every tier of the
  storage (``export_rows``, ``import_rows``, ``clear_tables``,
  ``reserve_rows``, ``snapshot`` / ``restore``), the row size of an export
  (``export_row_bytes``) and the stored keys per table (``sizes``);
* replication: in the hash table holding every key (the storage's
  ``DeltaRows`` face, settled first: other tiers written back, emptied before
  a write), rows past a score threshold with their slots (``export_changed``),
  writes at given slots (``place_rows``) or by key (``upsert_rows``),
  removals (``erase_rows``), and the scores of the next forward pass
  (``current_score``, ``fresh_scores``); score words are in the table's
  internal column order there (``score_columns`` maps the user's);
* metrics: the device counters of the last tier's hash table
  (``counters``: the storage's ``HashTier`` face), the capacities
  (``capacity``, ``limit``), the module's per-table ``stats`` and the bytes
  each table holds (``memory_per_table``: its ``Accounting``).

An external storage (``external_storage``) serves what the ``Storage``
interface allows (checkpoints; for metrics its sizes and capacities, no
counters: ``has_hash_table`` is False); the rest (a storage that is neither
``HashTier`` nor ``DeltaRows``) raises ``NotImplementedError`` naming the
operation and the storage.
"""

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from dynamicemb._checks import as_int, as_tensor
from dynamicemb.dynamicemb_config import (
    OPTIMIZER_STATE_DTYPE,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    embedding_row_bytes,
    saved_state_dim,
)
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.score_function import evaluate_scores
from dynamicemb.storage.scores import table_score_columns
from dynamicemb.storage.stats import TableStats
from dynamicemb.storage.types import DeltaRows, ExportedRows, HashTier, RowInit, TableStorage
from dynamicemb.table import ScoredHashTable, enums, keep_order
from dynamicemb.types import MemoryType, MultiTableAdmitter

S = DynamicEmbScoreStrategy

# Bytes of an int64 (keys, slots, score words) in an exported row.
_INT64_BYTES = 8


class ScoreClock(Protocol):
    """What the rows read from their module: the training step (set by a
    checkpoint load) and the CUSTOMIZED scores."""

    step: int

    def get_custom_score(self, table: int) -> int | None: ...

    def set_score(self, score: int, tables: Sequence[int] | None = None) -> None: ...


class TableRows:
    """The rows of the fused tables of one module (see the module docstring).

    Args:
        storage (TableStorage): where the rows live.
        layout (RowLayout): the rows' format.
        options (Sequence[DynamicEmbTableOptions]): one per table.
        strategies (tuple): the tables' score strategies (one tuple for all).
        row_init (RowInit): the module's new rows.
        clock (ScoreClock): the module's step and CUSTOMIZED scores.
        device (torch.device): where the module computes.
        score_function: the tables' victim score function, or None.
        optimizer_name (str or None): the optimizer whose state the rows carry.
        admitter (MultiTableAdmitter, optional): the tables' admitter.
        stats (TableStats): the module's per-table counters.
    """

    def __init__(
        self,
        storage: TableStorage,
        layout: RowLayout,
        options: Sequence[DynamicEmbTableOptions],
        strategies: tuple,
        row_init: RowInit,
        clock: ScoreClock,
        device: torch.device,
        score_function: Any,
        optimizer_name: str | None,
        admitter: MultiTableAdmitter | None,
        stats: TableStats,
    ) -> None:
        self.storage = storage
        self.layout = layout
        self.options = list(options)
        self.strategies = strategies
        self.no_eviction = S.NO_EVICTION in strategies
        self.dims = list(layout.dims)
        self.device = device
        self.score_function = score_function
        self.optimizer_name = optimizer_name
        self.training_state = bool(self.options[0].training)
        self.admitter = admitter
        self.stats = stats
        self._row_init = row_init
        self._clock = clock
        # Replication: the sequence number of the last delta each table's
        # contents reflect (dumped or replayed; None: unknown, loaded from a
        # checkpoint that does not record it).
        self.delta_sequence: list[int | None] = [0] * len(self.options)
        # ... and the run that numbered them: {"run": id, "epoch": n, "lineage":
        # [[epoch, parent epoch, parent sequence], ...]} (None: no delta yet).
        self.delta_source: list[dict | None] = [None] * len(self.options)

    # ---------------------------------------------------------- the tables --

    @property
    def num_tables(self) -> int:
        return len(self.options)

    @property
    def step(self) -> int:
        """The module's training step (a checkpoint records and restores it)."""
        return self._clock.step

    @step.setter
    def step(self, value: int) -> None:
        self._clock.step = int(value)

    def set_score(self, table: int, score: int) -> None:
        """CUSTOMIZED: the score ``table``'s keys get in the next forward passes."""
        self._clock.set_score(score, [table])

    @property
    def value_dtype(self) -> torch.dtype:
        """dtype the embeddings are stored (and exported) at."""
        return self.layout.dtype

    @property
    def optim_state_dtype(self) -> torch.dtype:
        """dtype the optimizer state is stored (and exported) at: float32."""
        return OPTIMIZER_STATE_DTYPE

    @property
    def num_scores(self) -> int:
        """Score words of a stored key (NO_EVICTION: one, the row)."""
        return len(self.strategies)

    def state_dim(self, table: int) -> int:
        """Optimizer-state elements of a row of ``table`` as it leaves these
        rows and enters them, in checkpoint files and deltas
        (``dynamicemb_config.saved_state_dim``: narrower than the stored row
        for rowwise Adagrad); 0 in eval mode."""
        return saved_state_dim(self.optimizer_name, self.layout.state_dims[table])

    def state_widths(self, table: int) -> tuple[int, ...]:
        """The optimizer-state widths the rows take (``import_rows``,
        ``place_rows``, ``upsert_rows``): ``state_dim``, and the stored row's
        own (checkpoints written before ``state_dim`` narrowed rowwise
        Adagrad's state hold all of it)."""
        return tuple(sorted({self.state_dim(table), self.layout.state_dims[table]}))

    def _narrow(self, table: int, rows: Iterator[ExportedRows]) -> Iterator[ExportedRows]:
        """Exported rows with their optimizer state at ``state_dim``."""
        sd = self.state_dim(table)
        for r in rows:
            if r.optimizer_state is not None and r.optimizer_state.shape[1] != sd:
                r.optimizer_state = r.optimizer_state[:, :sd].contiguous()
            yield r

    def _widen(self, table: int, state: torch.Tensor | None) -> torch.Tensor | None:
        """Optimizer state of one of the ``state_widths`` at the stored row's
        width: the columns past ``state_dim`` hold what a new row's hold.

        Raises:
            ValueError: another width (naming it).
        """
        if state is None:
            return None
        full = self.layout.state_dims[table]
        width = state.shape[1] if state.dim() == 2 else -1
        if width not in self.state_widths(table):
            raise ValueError(
                f"optimizer state of table {table} must be (n, {self.state_dim(table)}), got "
                f"shape {tuple(state.shape)}"
            )
        if width == full:
            return state
        out = torch.empty(state.shape[0], full, dtype=torch.float32, device=state.device)
        self._row_init.init_state(out)
        out[:, :width] = state
        return out

    def score_columns(self) -> list[int] | None:
        """For each score column in ``score_strategy`` tuple order, the table
        score word holding it; None under NO_EVICTION (whose word is a row)."""
        return None if self.no_eviction else table_score_columns(self.strategies)

    def keep_order(self, scores: torch.Tensor) -> torch.Tensor | None:
        """Keys best first, as the tables' eviction keeps them
        (``dynamicemb.table.keep_order``, the victim order of
        cc/table/scores.h): by the ``score_function``'s victim scores first
        when the tables have one (evaluated at one reading of the clock), then
        by their score words. ``scores``: (n, num_scores) int64 on the CPU, in
        ``score_strategy`` order. Returns a permutation of ``range(n)``; None
        under NO_EVICTION, which evicts nothing."""
        cols = self.score_columns()
        if cols is None:
            return None
        words = torch.empty_like(scores)
        words[:, cols] = scores
        victim = None
        if self.score_function is not None:
            now = int(self.timer().item())
            victim = evaluate_scores(self.score_function, scores, now)
        return keep_order(words, victim)

    def export_row_bytes(self, table: int, optim: bool = True, slots: bool = False) -> int:
        """Bytes of one exported row of ``table``: its key, embedding (at
        ``value_dtype``, its padding and an FP8 row's scale included:
        ``embedding_row_bytes``), optimizer state when ``optim`` (at
        ``optim_state_dtype``), score words, and its slot when ``slots``."""
        state = self.state_dim(table) * self.optim_state_dtype.itemsize if optim else 0
        ints = 1 + self.num_scores + (1 if slots else 0)
        emb_bytes = embedding_row_bytes(self.dims[table], self.value_dtype)
        return ints * _INT64_BYTES + emb_bytes + state

    def sizes(self) -> list[int]:
        """Keys stored per table, in any tier (reads the device)."""
        return self.storage.sizes()

    def admission_counter(self):
        """The admission ``Counter`` holding the tables' counts (the admitter's
        ``state()``), or None."""
        return None if self.admitter is None else self.admitter.state()

    # -------------------------------------------------------- checkpoints --

    def export_rows(self, table: int, chunk: int) -> Iterator[ExportedRows]:
        """The stored keys of ``table`` and their rows, ``chunk`` keys or fewer
        at a time. Reads each chunk's count (synchronizes)."""
        return self._narrow(table, self.storage.export_rows(table, chunk))

    def import_rows(self, table: int, keys, scores, embeddings, optimizer_state) -> torch.Tensor:
        """Stores keys with their rows in ``table``: as ``ExportedRows`` hold
        them (``scores`` None under NO_EVICTION; ``optimizer_state`` None
        gives the optimizer's initial state). A key whose home bucket is full
        fails, and is not counted as a training insert failure. Returns (n)
        bool, the keys stored."""
        table_ = self._last_table()
        col = int(enums.CounterCol.INSERT_FAILURES)
        failures = None if table_ is None else table_.counters[:, col].clone()
        stored = self.storage.import_rows(
            table, keys, scores, embeddings, self._widen(table, optimizer_state), self._row_init
        )
        if table_ is not None:
            self._last_table().counters[:, col] = failures
        return stored

    def clear_tables(self, tables: Sequence[int]) -> None:
        """Erases every key of ``tables`` from every tier."""
        self.storage.clear_tables(tables)

    def reserve_rows(self, table: int, incoming: int) -> None:
        """Expands ``table`` for ``incoming`` more keys, as a training insert would."""
        self.storage.reserve_rows(table, incoming)

    def snapshot(self) -> dict[str, Any]:
        """A copy of everything a load may change, for ``restore`` (the
        storage's tables and rows, rows in host memory; the step and the
        delta sequences)."""
        return {
            "storage": self.storage.snapshot(),
            "step": self.step,
            "delta_sequence": list(self.delta_sequence),
            "delta_source": list(self.delta_source),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Puts back the state ``snapshot`` copied."""
        self.storage.restore(snapshot["storage"])
        self.step = snapshot["step"]
        self.delta_sequence = list(snapshot["delta_sequence"])
        self.delta_source = list(snapshot["delta_source"])

    # -------------------------------------------------------- replication --

    def check_delta(self, what: str) -> None:
        """Raises what the delta operation ``what`` raises on a storage that
        has no hash table holding every key (``DeltaRows``), changing
        nothing.

        Raises:
            NotImplementedError: the rows live in an external storage, naming
                ``what`` and the storage.
        """
        if not isinstance(self.storage, DeltaRows):
            raise self._unsupported(what)

    def _delta(self, what: str, writing: bool = False) -> DeltaRows:
        """The storage's ``DeltaRows``, settled for a read (or a write), for
        ``what`` (``check_delta``)."""
        self.check_delta(what)
        self.storage.settle(writing)
        return self.storage

    def _table_index(self, table: Any) -> int:
        table = as_int(table, "table")
        if not 0 <= table < self.num_tables:
            raise ValueError(f"table {table} is out of range [0, {self.num_tables})")
        return table

    def _row_access_args(self, table: Any, keys: Any, **tensors: Any) -> int:
        """Checks the arguments of the row access methods before anything
        changes: ``table`` a table index, ``keys`` a 1-D int64 tensor, each
        other tensor (None: absent) with one row per key; none on the meta
        device. Returns the table index."""
        table = self._table_index(table)
        as_tensor(keys, "keys", dtypes=(torch.int64,), dim=1)
        for name, x in tensors.items():
            if x is None:
                continue
            as_tensor(x, name)
            if x.dim() == 0 or x.shape[0] != keys.numel():
                raise ValueError(
                    f"{name} must have one row per key ({keys.numel()}), got shape {tuple(x.shape)}"
                )
        return table

    def layout_of(self, table: int) -> dict[str, Any]:
        """What decides where ``table``'s keys sit: ``current_capacity``
        (key-map slots, the modulus of the home bucket), ``row_capacity``
        (value rows of the hash tier, as a one-tier tuple: the slots, or the
        rows under NO_EVICTION), ``bucket_capacity`` and ``num_scores``."""
        t = self._delta("layout_of").hash_table
        rows = t.row_capacity(table) if self.no_eviction else t.capacity(table)
        return {
            "current_capacity": t.capacity(table),
            "row_capacity": (rows,),
            "bucket_capacity": t.bucket_capacity(table),
            "num_scores": t.num_scores,
        }

    def delta_score_column(self) -> int:
        """The internal score word an incremental dump thresholds: the
        timestamp under a strategy with one, else word 0 (a STEP, CUSTOMIZED
        or LFU score; the row under NO_EVICTION)."""
        if S.TIMESTAMP in self.strategies:
            return table_score_columns(self.strategies)[self.strategies.index(S.TIMESTAMP)]
        return 0

    def current_score(self, table: int) -> int:
        """The score ``table``'s keys get in the next forward pass, the
        reference point of the next incremental dump: the clock under
        TIMESTAMP (one reading; synchronizes), the next step under STEP, the
        score ``set_score`` set under CUSTOMIZED (0 before any), 0 under LFU
        (a frequency has no clock), the next fresh row under NO_EVICTION."""
        t = self._delta("get_score").hash_table
        if S.TIMESTAMP in self.strategies:
            return int(t.timer().item())
        s = self.strategies[0]
        if s == S.STEP:
            return self.step + 1
        if s == S.CUSTOMIZED:
            return self._clock.get_custom_score(table) or 0
        if s == S.NO_EVICTION:
            return int(t.counters[table, enums.CounterCol.NEXT_ROW])
        return 0

    def fresh_scores(self, table: int, n: int) -> torch.Tensor:
        """(n, num_scores) internal score words the next forward pass would
        give new keys of ``table``: the clock, the next step, the CUSTOMIZED
        score, one occurrence for LFU."""
        t = self._delta("replay").hash_table
        out = torch.zeros(n, t.num_scores, dtype=torch.int64, device=self.device)
        for user_col, word in enumerate(table_score_columns(self.strategies)):
            s = self.strategies[user_col]
            if s == S.TIMESTAMP:
                out[:, word] = t.timer()
            elif s == S.LFU:
                out[:, word] = 1
            else:
                out[:, word] = self.current_score(table)
        return out

    def timer(self) -> torch.Tensor:
        """(1) int64: a reading of the clock the tables' TIMESTAMP scores use."""
        return self._table_for("timer").timer()

    def export_changed(self, table: int, chunk: int, threshold: int) -> Iterator[ExportedRows]:
        """The keys of ``table`` whose ``delta_score_column`` word is at least
        ``threshold``, with their rows, slots and score words, ``chunk`` slots
        scanned at a time (each reads its count: synchronizes)."""
        table = self._table_index(table)
        chunk = as_int(chunk, "chunk", min=1)
        threshold = as_int(threshold, "threshold")
        delta = self._delta("incremental_dump")
        rows = delta.export_changed(table, chunk, self.delta_score_column(), threshold)
        return self._narrow(table, rows)

    def check_place_rows(self, table: int, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Raises what ``place_rows`` would for these keys and slots
        (ValueError naming the first bad key or slot), changing nothing."""
        table = self._row_access_args(table, keys, slots=slots)
        delta = self._delta("replay_increment")
        delta.check_place(table, keys.to(self.device), slots.to(self.device))

    def place_rows(
        self,
        table: int,
        keys: torch.Tensor,
        slots: torch.Tensor,
        words: torch.Tensor,
        embeddings: torch.Tensor,
        optimizer_state: torch.Tensor | None,
        checked: bool = False,
    ):
        """Writes keys with their rows at given slots of ``table`` (a replay
        from a table of the same layout); the key that held a slot before is
        displaced (``evicted`` of the result).

        Args:
            keys (torch.Tensor): (n) int64.
            slots (torch.Tensor): (n) int64 slots in the table (0 ..
                capacity - 1), each in its key's home bucket.
            words (torch.Tensor): (n, num_scores) internal score words (under
                NO_EVICTION word 0 is the key's row).
            embeddings (torch.Tensor): (n, dim).
            optimizer_state (torch.Tensor, optional): (n, state_dim(table));
                None: a key that already held its slot keeps its state, the
                others get the initial state.
            checked (bool): ``check_place_rows`` passed for these already.

        Returns:
            InsertResult: the table's result.

        Raises:
            ValueError: a slot outside its key's home bucket (nothing changes).
        """
        table = self._row_access_args(
            table,
            keys,
            slots=slots,
            words=words,
            embeddings=embeddings,
            optimizer_state=optimizer_state,
        )
        delta = self._delta("replay_increment", writing=True)
        return delta.place(
            table,
            keys.to(self.device),
            slots.to(self.device),
            words.to(self.device),
            embeddings,
            self._widen(table, optimizer_state),
            self._row_init,
            checked,
        )

    def upsert_rows(self, table: int, keys, words, embeddings, optimizer_state):
        """Writes keys with their rows into ``table`` by this module's own
        layout: a key held is updated in place, a new one is inserted
        (growing a table that can grow, evicting the minimum of a full bucket
        as a training insert would). ``words``: internal score words (None
        under NO_EVICTION); ``optimizer_state`` as in ``place_rows``.

        Returns:
            (slots, status, evicted): as ``DeltaRows.upsert``.
        """
        table = self._row_access_args(
            table, keys, words=words, embeddings=embeddings, optimizer_state=optimizer_state
        )
        delta = self._delta("replay_by_key", writing=True)
        return delta.upsert(
            table,
            keys.to(self.device),
            None if words is None else words.to(self.device),
            embeddings,
            self._widen(table, optimizer_state),
            self._row_init,
        )

    def erase_rows(self, table: int, keys: torch.Tensor, record: bool = False) -> torch.Tensor:
        """Removes keys from ``table`` (every tier); with ``record`` the keys
        removed are kept for ``pop_erased``. Returns the (n) bool mask of the
        keys that were held."""
        table = self._row_access_args(table, keys)
        keys = keys.to(self.device)
        if not keys.numel():
            return torch.zeros(0, dtype=torch.bool, device=self.device)
        return self._delta("erase_keys", writing=True).erase(table, keys, record)

    def holds(self, table: int, keys: torch.Tensor) -> torch.Tensor:
        """(n) bool: which keys ``table`` holds (in any tier)."""
        table = self._row_access_args(table, keys)
        keys = keys.to(self.device)
        return self.storage.contains(keys, torch.full_like(keys, table))

    def pop_erased(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """The keys ``erase_rows(record=True)`` removed since the last call,
        per table, each once; clears them (only ``tables``, if given)."""
        erased = self._delta("pop_erased_keys").pop_erased(tables)
        return [torch.unique(k) for k in erased]

    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Per table, the keys the storage's last tier evicted since the last
        call (``evicted_item_mode=RETAIN_KEY``; empty otherwise)."""
        return self.storage.pop_evicted_keys(tables)

    # ------------------------------------------------------------ metrics --

    def _last_table(self) -> ScoredHashTable | None:
        """The hash table of the storage's last tier (its ``HashTier``);
        None for an external storage."""
        return self.storage.hash_table if isinstance(self.storage, HashTier) else None

    @property
    def hash_table(self) -> ScoredHashTable:
        """The hash table of the storage's last tier, the one holding every
        key (its counters, capacities and slots).

        Raises:
            NotImplementedError: the rows live in an external storage.
        """
        return self._table_for("hash_table")

    def _table_for(self, what: str) -> ScoredHashTable:
        """``hash_table``, for ``what``.

        Raises:
            NotImplementedError: the rows live in an external storage, which
                no hash table of dynamicemb holds (naming ``what``).
        """
        table = self._last_table()
        if table is None:
            raise self._unsupported(what)
        return table

    def _unsupported(self, what: str) -> NotImplementedError:
        """The error of an operation an external storage does not support."""
        backing = getattr(self.storage, "backing", self.storage)
        name = getattr(backing, "name", type(backing).__name__)
        return NotImplementedError(
            f"{what} is not supported for tables whose rows live in the external storage "
            f"{name}: no dynamicemb hash table holds them"
        )

    @property
    def has_hash_table(self) -> bool:
        """Whether a dynamicemb hash table holds every key (and keeps the
        ``counters``); False for an external storage."""
        return isinstance(self.storage, HashTier)

    def counters(self, what: str = "metrics") -> torch.Tensor:
        """(num_tables, counter columns) int64 device counters of the last
        tier's hash table (``CounterCol``: size, inserts, evictions, insert
        failures, ...). A relayout replaces it whole."""
        return self._table_for(what).counters

    def capacity(self, table: int) -> int:
        """Slots of ``table``'s key map now (an external storage: the keys it
        can hold, its ``Storage.capacity``)."""
        return self.storage.capacity(table)

    def limit(self, table: int) -> int:
        """Rows ``table`` can hold now (NO_EVICTION: its value rows; else its
        slots; an external storage: its ``Storage.capacity``)."""
        return self.storage.limit(table)

    def memory_per_table(self, mem_type: MemoryType) -> list[int]:
        """Bytes of ``mem_type`` memory each table holds in the storage's
        tiers (its slots in the hash tables and its value rows) and its share
        of the admitter's counter."""
        out = self.storage.memory_per_table(mem_type)
        per_table = getattr(self.admission_counter(), "memory_per_table", None)
        if per_table is not None:
            out = [a + b for a, b in zip(out, per_table(mem_type))]
        return out
