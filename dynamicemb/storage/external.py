"""An external ``Storage`` as the backing tier of a cache.

The module constructs the ``external_storage`` class with one
``StorageTable`` per table it fuses and the device, checks the result
against the contract of ``dynamicemb.types.Storage`` and talks to it in its
terms: per logical table, ``(n, value_dim)`` float32 rows (the embedding,
exact whatever ``embedding_dtype``, then the optimizer state). A subclass that
breaks the contract (a missing method, a wrong row format, a result of the
wrong type, shape or dtype) is refused with an error naming the class and the
method.

A step whose ``insert`` raises is put back (``write_back``): every table of
the call, the one that raised included (it may have written part of its
rows), gets its earlier rows back. When the storage raises again while being
put back (still down), the put-back is kept and made before the storage's
next use (``_settle``): until then every use fails the same way, and once
the storage answers, it holds what it held before the failed step.
"""

from collections.abc import Iterator, Sequence

import torch

from dynamicemb._checks import is_int
from dynamicemb.storage import space as sp
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.rows import rows_buffer
from dynamicemb.storage.types import Backing, ExportedRows, Footprint, RowInit
from dynamicemb.table import PAD_KEY
from dynamicemb.types import MemoryType, Storage, StorageTable


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return repr(x)


class ExternalBacking(Backing):
    """The tier below a cache, kept by a user's ``Storage`` subclass. It is
    no ``HashTier``: what needs a dynamicemb hash table (incremental dumps,
    replays, table counters) is refused for it.

    Args:
        cls (type): the ``Storage`` subclass.
        layout (RowLayout): the tables' row format.
        capacities (Sequence[int]): each table's ``max_capacity``.
        num_scores (int): score words per key.
        device (torch.device): the module's device.

    Raises:
        TypeError: ``cls`` is not a ``Storage`` subclass, cannot be
            constructed (an abstract method missing), or returns the wrong
            kind of value.
        ValueError: its reported row format disagrees with the tables'.
    """

    has_scores = False  # Storage.find returns rows only
    strategies = None
    # A user's storage may raise in any call: the cache keeps what it needs
    # to put a failed step back (CachedStorage).
    can_fail = True

    def __init__(
        self,
        cls: type,
        layout: RowLayout,
        capacities: Sequence[int],
        num_scores: int,
        device: torch.device,
    ) -> None:
        self.name = getattr(cls, "__qualname__", repr(cls))
        if not (isinstance(cls, type) and issubclass(cls, Storage)):
            raise TypeError(f"external_storage must be a subclass of Storage, got {cls!r}")
        self.layout = layout
        self.device = device
        self.tables = [
            StorageTable(
                embedding_dim=d,
                value_dim=d + s,
                embedding_dtype=layout.dtype,
                capacity=int(c),
                num_scores=int(num_scores),
            )
            for d, s, c in zip(layout.dims, layout.state_dims, capacities)
        ]
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            names = ", ".join(f"Storage.{m}" for m in missing)
            raise TypeError(f"external_storage {self.name} does not implement {names}")
        try:
            self.storage = cls(self.tables, device)
        except (TypeError, AttributeError) as e:
            # A constructor of another signature (say, one taking the table's
            # options and optimizer) fails on the arguments it is given.
            raise TypeError(
                f"external_storage {self.name} cannot be constructed as "
                f"{self.name}(tables, device), tables a list of dynamicemb.types.StorageTable "
                f"and device a torch.device: {type(e).__name__}: {e}"
            ) from e
        for t, spec in enumerate(self.tables):
            for method in ("embedding_dim", "value_dim", "embedding_dtype"):
                got = getattr(self.storage, method)(t)
                if got != getattr(spec, method):
                    raise ValueError(
                        f"external_storage {self.name}.{method}({t}) returned {got!r}; "
                        f"the table's is {getattr(spec, method)!r}"
                    )
            for method in ("size", "capacity"):
                self._int(method, getattr(self.storage, method)(t))
        for mem in MemoryType:
            self._int("memory_usage", self.storage.memory_usage(mem))
        # A put-back a failed step could not make (``write_back``).
        self._pending: tuple | None = None

    def _settle(self) -> None:
        """Makes the put-back a failed step could not make (the storage was
        down), before anything else asks the storage; raises (changing
        nothing else) while it still cannot."""
        if self._pending is not None:
            self._put_back(*self._pending)
            self._pending = None

    def _int(self, method: str, value) -> int:
        if not is_int(value) or value < 0:
            raise TypeError(
                f"external_storage {self.name}.{method} must return an int >= 0, "
                f"got {_describe(value)}"
            )
        return value

    def _by_table(self, tids: torch.Tensor, keys: torch.Tensor | None = None):
        """(table, index of its entries) for each table present in ``tids``
        (with ``keys``: the entries whose key is not ``PAD_KEY``)."""
        valid = None if keys is None else keys != PAD_KEY
        for t in torch.unique(tids).tolist():
            sel = tids == t if valid is None else (tids == t) & valid
            idx = sel.nonzero().squeeze(1)
            if idx.numel():
                yield t, idx

    def _find(self, keys, t: int):
        """(found (n) bool, (n, value_dim) float32 rows) of one table's keys."""
        self._settle()
        n = keys.numel()
        values = torch.zeros((n, self.tables[t].value_dim), dtype=torch.float32, device=self.device)
        found = self.storage.find(keys, torch.full_like(keys, t), values)
        if (
            not isinstance(found, torch.Tensor)
            or found.dtype != torch.bool
            or tuple(found.shape) != (n,)
        ):
            raise TypeError(
                f"external_storage {self.name}.find must return a bool tensor of shape "
                f"({n},), got {_describe(found)}"
            )
        return found.to(self.device), values

    # ------------------------------------------------------- as a backing --

    def fetch(self, keys: torch.Tensor, tids: torch.Tensor):
        """``(found, staging rows, None)`` of the keys the storage holds
        (``PAD_KEY`` entries are not asked for: not found)."""
        n = keys.numel()
        found = torch.zeros(n, dtype=torch.bool, device=self.device)
        buf = sp.staging(n, self.layout, self.device)
        for t, idx in self._by_table(tids, keys):
            f, values = self._find(keys[idx], t)
            found[idx] = f
            dim = self.tables[t].embedding_dim
            sp.pack_rows(buf, tids[idx], self.layout, values[:, :dim], values[:, dim:], index=idx)
        return found, buf, None

    def locate(self, keys: torch.Tensor, tids: torch.Tensor):
        """``fetch``, as a row space a cache copies the rows from: ``(found,
        the staging rows as a row space, their offsets (-1 where not found),
        None)``."""
        found, buf, _ = self.fetch(keys, tids)
        offsets = sp.staging_offsets(keys.numel(), self.layout, self.device)
        return found, sp.as_space(buf), torch.where(found, offsets, -1), None

    def expand_for(self, keys, tids) -> None:
        """The storage sizes itself."""

    def write_back(
        self, keys, tids, src, src_offsets, scores, protect=None, expand=True, before=None
    ) -> None:
        """Hands rows (from the row space ``src``) to the storage; it scores
        them itself. ``PAD_KEY`` entries are left out; ``protect`` and
        ``expand`` do not apply (the rows a ``locate`` found are copies).

        The rows go one table per ``Storage.insert`` call. When a call raises,
        the tables given rows so far (the one whose call raised included: it
        may have written some) are put back as ``before`` says they were, if
        given: ``(found (n) bool, a staging buffer of n rows)``, per key
        whether the storage held it and its row then (re-inserted; the others
        erased), now or, when the storage raises again, before its next use
        (``_settle``); then the error propagates.
        """
        keep = (keys != PAD_KEY).nonzero().squeeze(1)
        keys, tids, src_offsets = keys[keep], tids[keep], src_offsets[keep]
        if keys.numel() == 0:
            return
        self._settle()
        buf = sp.stage_rows(src, src_offsets, tids, self.layout)
        touched = []
        try:
            for t, idx in self._by_table(tids):
                touched.append((t, idx))
                self.storage.insert(keys[idx], tids[idx], self._values(buf, tids, idx, t), None)
        except BaseException:
            if before is not None:
                pending = (keys, tids, before[0][keep], before[1][keep], touched)
                try:
                    self._put_back(*pending)
                except BaseException:
                    self._pending = pending  # made before the storage's next use
            raise

    def _values(self, buf, tids, idx, t: int) -> torch.Tensor:
        """The ``(m, value_dim)`` float32 rows ``idx`` (all of table ``t``)
        of a staging buffer, as the storage takes them."""
        emb, state = sp.unpack_rows(buf[idx], tids[idx], self.layout)
        spec = self.tables[t]
        return torch.cat(
            [emb[:, : spec.embedding_dim], state[:, : spec.value_dim - spec.embedding_dim]], dim=1
        )

    def _put_back(self, keys, tids, found, rows, written) -> None:
        """Undoes the inserts of ``written`` ((table, index) pairs): keys the
        storage held get their earlier ``rows`` back, the others are erased."""
        for t, idx in written:
            held, new = idx[found[idx]], idx[~found[idx]]
            if held.numel():
                self.storage.insert(keys[held], tids[held], self._values(rows, tids, held, t), None)
            if new.numel():
                self.storage.erase(keys[new], tids[new])

    def contains(self, keys, tids) -> torch.Tensor:
        found = torch.zeros(keys.numel(), dtype=torch.bool, device=self.device)
        for t, idx in self._by_table(tids, keys):
            found[idx] = self._find(keys[idx], t)[0]
        return found

    # -------------------------------------------------------- checkpoints --

    def export_rows(self, table: int, chunk: int) -> Iterator[ExportedRows]:
        self._settle()
        spec = self.tables[table]
        for batch in self.storage.export_batches(table, chunk):
            if not isinstance(batch, tuple) or len(batch) != 3:
                raise TypeError(
                    f"external_storage {self.name}.export_batches must yield (keys, values, "
                    f"scores) tuples, got {_describe(batch)}"
                )
            keys, values, scores = batch
            m = keys.numel() if isinstance(keys, torch.Tensor) else -1
            ok = (
                isinstance(keys, torch.Tensor)
                and keys.dtype == torch.int64
                and keys.dim() == 1
                and isinstance(values, torch.Tensor)
                and tuple(values.shape) == (m, spec.value_dim)
                and values.is_floating_point()
                and isinstance(scores, torch.Tensor)
                and tuple(scores.shape) == (m, spec.num_scores)
                and scores.dtype == torch.int64
            )
            if not ok:
                raise TypeError(
                    f"external_storage {self.name}.export_batches must yield int64 keys (m,), "
                    f"values (m, {spec.value_dim}) and int64 scores (m, {spec.num_scores}); got "
                    f"{_describe(keys)}, {_describe(values)}, {_describe(scores)}"
                )
            values = values.to(self.device, torch.float32)
            d = spec.embedding_dim
            yield ExportedRows(
                keys=keys.to(self.device),
                scores=scores.to(self.device),
                embeddings=values[:, :d].to(self.layout.dtype),
                optimizer_state=values[:, d:] if spec.value_dim > d else None,
            )

    def import_rows(self, table, keys, scores, embeddings, optimizer_state, init: RowInit):
        self._settle()
        tids = torch.full_like(keys, table)
        buf = rows_buffer(keys, tids, embeddings, optimizer_state, None, init, self.layout)
        emb, state = sp.unpack_rows(buf, tids, self.layout)
        spec = self.tables[table]
        values = torch.cat(
            [emb[:, : spec.embedding_dim], state[:, : spec.value_dim - spec.embedding_dim]], dim=1
        )
        self.storage.insert(keys, tids, values, None if scores is None else scores.to(self.device))
        return torch.ones_like(keys, dtype=torch.bool)

    def clear_tables(self, tables: Sequence[int]) -> None:
        for t in tables:
            keys = [rows.keys for rows in self.export_rows(t, 1 << 16)]
            if keys:
                k = torch.cat(keys)
                self.storage.erase(k, torch.full_like(k, t))

    def reserve_rows(self, table: int, incoming: int) -> None:
        """The storage sizes itself."""

    def room_for(self, tids: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """The storage sizes itself."""
        return None

    def reserve(self, incoming: Sequence[int]) -> None:
        """The storage sizes itself."""

    def snapshot(self) -> None:
        """The storage's own rows are not copied (see TableStorage.snapshot)."""
        return None

    def restore(self, snapshot) -> None:
        """Nothing was copied."""

    # ---------------------------------------------------------- accounting --

    def footprint(self) -> Footprint:
        return Footprint(
            device=self._int("memory_usage", self.storage.memory_usage(MemoryType.DEVICE)),
            host=self._int("memory_usage", self.storage.memory_usage(MemoryType.HOST)),
        )

    def footprint_per_table(self) -> list[Footprint]:
        """Not split by table: the storage reports its memory as a whole."""
        return [Footprint(0, 0) for _ in self.tables]

    def sizes(self) -> list[int]:
        return [self._int("size", self.storage.size(t)) for t in range(len(self.tables))]

    def capacity(self, table: int) -> int:
        """The keys the storage can hold of ``table`` (``Storage.capacity``)."""
        return self._int("capacity", self.storage.capacity(table))

    def limit(self, table: int) -> int:
        """``capacity``: the storage's rows are its keys'."""
        return self.capacity(table)

    def pop_evicted_keys(self, tables=None) -> list[torch.Tensor]:
        """An external storage keeps its own evictions."""
        return [torch.empty(0, dtype=torch.int64, device=self.device) for _ in self.tables]
