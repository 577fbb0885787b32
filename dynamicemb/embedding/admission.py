"""The admission stage of a module's training step: which of a batch's
distinct keys that no tier stores may enter the tables
(docs/architecture.md, "A training step, top to bottom", step 5).

A module whose tables have an ``admit_strategy`` holds one admitter for them
(``create_admitter``); ``ModuleAdmission`` runs it in one of two ways:

- **Padded, in one op.** A ``PaddedAdmitter`` (the frequency admitter)
  decides for the padded batch of distinct keys in one op that also looks
  them up in the storage's key table (``counter_admit``): the keys stored,
  admitted and rejected are marked on the device, nothing is read on the
  host, every shape is the batch's. The stored and admitted keys are found
  or inserted by the storage (``train_rows`` with ``lookup``), the rejected
  ones read fill rows of the rejected-row initializer, written in rank order
  into a fill buffer of the batch's length (``init_rows_at``, no
  selection). The step stays sync-free and its lookup may be replayed from a
  CUDA graph, the counter's tensors being part of the state it replays over
  (``graph_state``).
- **Exact.** Any other admitter (the spec's ``MultiTableAdmitter.admit``
  takes the missing keys alone), or a storage whose keys are not in one
  table (a cache), gets exactly the keys stored nowhere: ``contains``, a
  selection, the admitter's answer, the insert of the kept keys. On a GPU
  that reads the number of distinct keys on the host.

Both admit and reject the same keys, count the same and give the same rows
and outputs (tests/admission/test_padded_admission.py).
"""

import abc

import torch

from dynamicemb.embedding.initializer import MultiTableInitializer
from dynamicemb.embedding.row_init import ModuleRowInit, fill_width
from dynamicemb.storage.stats import StatCol
from dynamicemb.table import ScoredHashTable, enums
from dynamicemb.types import MultiTableAdmitter


class PaddedAdmitter(abc.ABC):
    """An admitter that decides for a padded batch of distinct keys in one
    op, looking them up in the storage's key table itself (see the module
    docstring). dynamicemb's ``MultiTableFrequencyAdmitter`` is one."""

    @abc.abstractmethod
    def takes_padded(self, store: ScoredHashTable) -> bool:
        """Whether it can decide over this key table (its device, its
        tables)."""

    @abc.abstractmethod
    def admit_padded(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        frequencies: torch.Tensor,
        store: ScoredHashTable,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(status, per_table): (n) int8 ``enums.Admission`` of each entry of
        a padded batch (padding is NONE) and (num_tables, 2) int64, the
        entries admitted and rejected per table; read nothing on the host."""

    @abc.abstractmethod
    def graph_state(self) -> tuple:
        """The addresses of the state tensors ``admit_padded`` writes and
        the constants it passes: a CUDA graph of it replays while they are
        unchanged."""


def create_admitter(table_options, device: torch.device) -> MultiTableAdmitter | None:
    """The admitter of the tables' admission strategies, or None."""
    strategies = [o.admit_strategy for o in table_options]
    if all(s is None for s in strategies):
        return None
    if any(s is None for s in strategies):
        raise ValueError(
            "fused tables must all have an admit_strategy or none, got "
            f"{[type(s).__name__ if s is not None else None for s in strategies]}"
        )
    keys = {(type(s), s.get_grouped_key()) for s in strategies}
    if len(keys) != 1:
        raise ValueError(
            "fused tables must share one admission configuration (their admit_strategy "
            f"get_grouped_key), got {sorted(repr(k) for k in keys)}"
        )
    admitter = type(strategies[0]).create_admitter(strategies, device)
    if not isinstance(admitter, MultiTableAdmitter):
        raise TypeError(
            f"{type(strategies[0]).__name__}.create_admitter must return a "
            f"MultiTableAdmitter, got {admitter!r}"
        )
    return admitter


class ModuleAdmission:
    """A module's admission stage (see the module docstring).

    Args:
        module (BatchedDynamicEmbeddingTablesV2): its storage, statistics,
            dims, seed and layout.
        admitter (MultiTableAdmitter): the tables' admitter.
        row_init (ModuleRowInit): the module's initializers and fill rows.
        find_or_insert (Callable): the module's training find-or-insert of
            distinct keys (``keys, tids, counts, step, num_keys, lookup=``).

    Attributes:
        padded (bool): the admitter decides for padded batches in one op
            over the storage's key table (else it gets exact batches).
        initializer (MultiTableInitializer): writes the rejected keys' rows.
    """

    def __init__(
        self, module, admitter: MultiTableAdmitter, row_init: ModuleRowInit, find_or_insert
    ) -> None:
        self.module = module
        self.admitter = admitter
        self.row_init = row_init
        self.find_or_insert = find_or_insert
        self.initializer: MultiTableInitializer = (
            admitter.non_admitted_initializer or row_init.initializers[False]
        )
        # Its groups built here, not in a (captured or traced) training step.
        self.initializer.groups(module.dims, module.device)
        store = module.storage.key_table()
        self.padded = (
            module.storage.takes_padded_batches
            and store is not None
            and isinstance(admitter, PaddedAdmitter)
            and admitter.takes_padded(store)
        )
        self._fill_width = fill_width(module)

    def graph_state(self) -> tuple | None:
        """The admitter's part of a CUDA graph's state, or None when its
        decisions may not be captured (exact batches)."""
        return self.admitter.graph_state() if self.padded else None

    def rows(self, su, counts, step):
        """(rows, fill) of the batch's distinct keys ``su`` (padded when
        ``padded``): the stored and admitted keys found or inserted (-1 where
        an insert failed), the rejected ones reading fill rows; ``counts``
        are the LFU increments, ``step`` the STEP score."""
        if not self.padded:
            return self._rows_exact(su, counts, step)
        m = self.module
        keys, tids = su.keys, su.table_ids
        status, per_table = self.admitter.admit_padded(keys, tids, su.counts, m.storage.key_table())
        m.stats.add_columns(StatCol.ADMISSIONS, per_table)  # and REJECTIONS, the next column
        lookup = status <= int(enums.Admission.ADMITTED)  # stored or admitted
        rows = self.find_or_insert(keys, tids, counts, step, su.num_unique, lookup=lookup)
        return self._fill_rejected(rows, status == int(enums.Admission.REJECTED), keys, tids)

    def _fill_rejected(self, rows, rejected, keys, tids):
        """(rows, fill): the rejected entries, and the keys the table
        refused (``refuse_cold_keys``), read fill rows
        (``ModuleRowInit.fill_marked``)."""
        m = self.module
        if m.refusal is not None:
            rejected = rejected | m.refusal.refused(rows)
        return self.row_init.fill_marked(
            rows, rejected, keys, tids, self.initializer, self._fill_width
        )

    def _rows_exact(self, su, counts, step):
        """rows() of an exact batch through ``MultiTableAdmitter.admit``."""
        m = self.module
        keys, tids = su.keys, su.table_ids
        missing, admitted = self._admit(keys, tids, su.counts)
        rejected = missing.masked_select(~admitted)
        keep = torch.ones(keys.shape, dtype=torch.bool, device=m.device)
        keep = keep.index_fill_(0, rejected, False).nonzero().squeeze(1)
        kept = [x.index_select(0, keep) for x in (keys, tids, counts)]
        rows = torch.full_like(keys, -1).index_copy_(0, keep, self.find_or_insert(*kept, step))
        if m.refusal is not None:
            rejected = torch.cat([rejected, m.refusal.refused(rows).nonzero().squeeze(1)])
        return self.row_init.with_fill(rows, rejected, keys, tids, self.initializer)

    def _admit(self, keys, tids, counts):
        """Puts the batch's keys that are stored nowhere to the admitter.

        Returns the indices of the missing keys and the admitter's answer for
        each (bool)."""
        m = self.module
        idx = (~m.storage.contains(keys, tids)).nonzero().squeeze(1)
        m_keys, m_tids, m_counts = (x.index_select(0, idx) for x in (keys, tids, counts))
        admitted = self.admitter.admit(m_keys, m_tids, m_counts)
        if (
            not isinstance(admitted, torch.Tensor)
            or admitted.dtype != torch.bool
            or admitted.shape != idx.shape
        ):
            got = (
                f"{admitted.dtype} {tuple(admitted.shape)}"
                if isinstance(admitted, torch.Tensor)
                else repr(admitted)
            )
            raise TypeError(
                f"{type(self.admitter).__name__}.admit must return a bool tensor of shape "
                f"({idx.numel()},), got {got}"
            )
        admitted = admitted.to(m.device)
        # Per table: the missing keys admitted, and those rejected.
        per_table = torch.zeros(len(m.table_options), dtype=torch.int64, device=m.device)
        missing = per_table.index_add(0, m_tids, torch.ones_like(m_tids))
        admits = per_table.index_add(0, m_tids, admitted.to(torch.int64))
        m.stats.add(StatCol.ADMISSIONS, admits)
        m.stats.add(StatCol.REJECTIONS, missing - admits)
        return idx, admitted
