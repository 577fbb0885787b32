"""The hybrid table (``caching=False``): one hash table whose rows are split
between device memory and pinned host memory, moved over the bus once per
step each way, with the rows used again kept in device memory.

A table split between the tiers (some of its rows in each; with every row in
one tier the table is a plain ``HashTableStorage``, whose kernels address
device rows or pinned host rows in place) steps as follows. A training
lookup finds or inserts the batch's distinct keys as the
all-device table does (``HashTableStorage``). The rows of the keys whose rows
are in host memory are then gathered, in one ``copy_rows`` of wide reads of the
pinned memory in address order, into a staging buffer on the device (a new key's row is
initialized there, never read); the pooling and update kernels address the
device rows and that buffer (the row space of the step: ``space()``), never
host memory. After the update (``after_update``) each staged row goes back
once: into device memory when the clock below gives it a device row (whose
previous row goes out to the host row the staged one leaves, gathered into
device memory first), else to its host row. The writes into host memory run
on a side stream (``HostWrites``: the staged rows straight from their
buffer), and the next step waits for them only where it reads host rows
again (its staging copy). A batch whose rows are all in device memory is the
all-device table's step.

Which device row a staged row takes is a clock over each split table's
device rows (``Remap`` of ``placement.py``): a device row used since the clock's hand last
passed it is kept (its mark cleared), another is given to the staged row; the
hand moves past one device row per staged row (at most all of them per
step). A row used in every pass of the hand stays in device memory; a row
that is not used again leaves. Only rows move, never keys: slots, scores and
evictions are the all-device table's, so the tables train bit for bit alike.

Reads between a training lookup and its update (``eval_rows``, ``read``:
exports, ``read_rows``) see the staged rows, published to host memory first;
the writers (checkpoint loads, replication after ``settle``, ``flush``)
first finish a batch that never got its update, as the next training lookup
does.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dynamicemb.storage import space as sp
from dynamicemb.storage.hash_storage import HashTableStorage
from dynamicemb.storage.rows import write_initial_rows
from dynamicemb.storage.scores import BatchScore, batch_policies


@dataclass
class _Staged:
    """A training batch's rows staged from host memory: row i of ``buffer``
    is table ``tids[i]``'s row at ``host[i]`` of the row space (``index[i]``
    its entry of the row map, -1 for a table in one tier)."""

    buffer: torch.Tensor
    tids: torch.Tensor
    host: torch.Tensor
    index: torch.Tensor | None
    published: bool = False


class HybridStorage(HashTableStorage):
    """The rows of fused tables split between device and host memory by
    their budgets, staged through device memory in training (see the module
    docstring). Takes the arguments of ``HashTableStorage``.

    Attributes:
        host_reads (torch.Tensor): rows read from host memory by training
            lookups (on the device, cumulative).
        host_writes (torch.Tensor): rows written to host memory after their
            updates (a staged row, or the device row it displaced).
        promotions (torch.Tensor): staged rows moved into device memory.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Its rows go to host memory on the side stream, the device rows the
        # staged ones displace (gathered into device memory first) with them.
        self.writes.max_rows = None
        self._staged: _Staged | None = None
        self._kernel_space: tuple[torch.Tensor, torch.Tensor] | None = None
        zero = torch.zeros((), dtype=torch.int64, device=self.device)
        self.host_reads, self.host_writes, self.promotions = zero, zero.clone(), zero.clone()

    def _graph_state(self) -> tuple | None:
        """A split table's training lookup reads a count on the host and
        keeps a batch staged: no CUDA graph of it. With every row in one tier
        it is the ``HashTableStorage``'s."""
        if self.placement.remap is not None:
            return None
        return super()._graph_state()

    def space(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._kernel_space is not None:
            return self._kernel_space
        return self.rows_space.tensors

    # ----------------------------------------------------------- training --

    def _train_rows(self, keys, tids, counts, score: BatchScore, init) -> torch.Tensor:
        self.after_update()  # a previous batch without an update
        if self.placement.remap is None:
            # Every row in one tier: the all-device table, or the host table
            # whose kernels read and write its pinned rows in place (its step
            # reads nothing on the host and takes no device memory for rows).
            return super()._train_rows(keys, tids, counts, score, init)
        policies, vals = batch_policies(self.strategies, score, counts)
        slots, status, _ = self.insert(keys, tids, policies, vals, train=True)
        # After an expansion too: growth adds host rows, a split table stays split.
        p = self.placement
        local = self.local_rows(slots, tids)
        offsets = p.offsets(local, tids)
        new = self._new(status)
        host = offsets >= p.size0
        self._mark_used(offsets, tids, ~host & (offsets >= 0))
        # The one read of the step on the host: the staging buffer's rows.
        n = int(host.sum())
        if n == 0:
            self.write_new_rows(torch.where(new, offsets, -1), keys, tids, init)
            return self.mark_refused(offsets, status)
        pos = torch.nonzero_static(host, size=n).squeeze(1)
        st_tids, st_host, st_new = tids[pos], offsets[pos], new[pos]
        buffer = torch.empty((n, self.layout.max_row_bytes), dtype=torch.uint8, device=self.device)
        st_off = sp.staging_offsets(n, self.layout, self.device)
        self.writes.wait()  # the last step's rows on their way to host memory
        sp.copy_rows(
            sp.as_space(buffer),
            torch.where(st_new, -1, st_off),
            self.rows_space.tensors,
            st_host,
            self.layout.row_bytes_of(st_tids),
            by="src",
        )
        rows = offsets.index_copy(0, pos, p.size0 + st_off)
        kernels = (self.rows_space.seg0.data, buffer.view(-1))
        write_initial_rows(kernels, torch.where(new, rows, -1), keys, tids, init, self.layout)
        self._staged = _Staged(buffer, st_tids, st_host, p.map_index(local[pos], st_tids))
        self._kernel_space = kernels
        self.host_reads += n - st_new.sum()
        return self.mark_refused(rows, status)

    def _mark_used(self, offsets, tids, on_device) -> None:
        """Marks the device rows of split tables a batch uses (``on_device``
        entries at ``offsets``): the clock keeps them this pass."""
        p, r = self.placement, self.placement.remap
        rb, _, dev_base, _ = p.params[tids].unbind(1)
        at = r.dev_base[tids] + (offsets - dev_base) // rb
        sp.scatter_rows(
            r.ref,
            torch.where(on_device & (r.base[tids] >= 0), at, -1),
            torch.ones_like(at, dtype=torch.int32),
        )

    def after_update(self) -> None:
        """Writes the staged rows back, each once: into device memory where
        the clock gives it a device row (whose row goes to host memory in its
        place), else to its host row."""
        st = self._staged
        if st is None:
            # Nothing staged (every row in one tier, or no batch since): no
            # state changes, so a traced step (torch.compile) has no side effect.
            return
        self._kernel_space = None
        self._staged = None
        n = st.tids.numel()
        rb = self.layout.row_bytes_of(st.tids)
        space = self.rows_space.tensors
        promote, victim = self._clock(st)
        # The displaced device rows first (gathered now, written to the host
        # rows the promoted ones leave on the bus stream): the staged rows
        # take their place.
        displaced = torch.where(promote, victim, -1)
        self.writes.stage(space, st.host, space, displaced, rb, every=True)
        sp.copy_rows(
            space,
            displaced,
            sp.as_space(st.buffer),
            sp.staging_offsets(n, self.layout, self.device),
            rb,
        )
        # The others to their host rows, straight from the staging buffer.
        self.writes.queue(space, torch.where(promote, -1, st.host), st.buffer, rb)
        self.writes.submit()
        self.host_writes += n

    def _clock(self, st: _Staged) -> tuple[torch.Tensor, torch.Tensor]:
        """The clock's step for the staged rows of split tables, without
        reading anything on the host: which of them take a device row
        (``promote``) and where that row is (``victim`` offsets); updates the
        row map, the marks and the hands."""
        p, r = self.placement, self.placement.remap
        t = st.tids
        n, num_tables = t.numel(), len(p.rows)
        # Each staged row's rank among its table's.
        count = torch.zeros(num_tables, dtype=torch.int64, device=self.device)
        count.index_add_(0, t, torch.ones_like(t))
        order = torch.argsort(t, stable=True)
        first = torch.cumsum(count, 0) - count
        rank = torch.empty_like(t)
        rank[order] = torch.arange(n, device=self.device) - first[t[order]]
        rb, dev, dev_base, _ = p.params[t].unbind(1)
        ordinal = r.split[t]
        passed = (ordinal >= 0) & (rank < dev)
        q = (r.hand[ordinal.clamp(min=0)] + rank) % dev.clamp(min=1)
        at = torch.where(passed, r.dev_base[t] + q, -1)
        used = r.ref[at.clamp(min=0)] != 0
        promote = passed & ~used
        victim = dev_base + q * rb
        held = r.owner[at.clamp(min=0)]
        moved = torch.where(promote, at, -1)
        sp.scatter_rows(r.where, torch.where(promote, st.index, -1), victim)
        sp.scatter_rows(r.where, torch.where(promote, held, -1), st.host)
        sp.scatter_rows(r.owner, moved, st.index)
        sp.scatter_rows(r.ref, at, promote.to(torch.int32))
        d = p.params[r.tables, 1]
        r.hand.copy_((r.hand + torch.minimum(count[r.tables], d)) % d)
        self.promotions += promote.sum()
        return promote, victim

    # ------------------------------------------------------ reads, writes --

    def _publish(self) -> None:
        """Copies the staged rows of a batch awaiting its update to their
        host rows (the batch stays staged), for a read of host memory."""
        st = self._staged
        if st is None or st.published:
            return
        sp.copy_rows(
            self.rows_space.tensors,
            st.host,
            sp.as_space(st.buffer),
            sp.staging_offsets(st.tids.numel(), self.layout, self.device),
            self.layout.row_bytes_of(st.tids),
            by="dst",
        )
        st.published = True

    def _finish(self) -> None:
        """Writes back a batch that never got its update and orders what
        follows after every row on its way to host memory."""
        self.after_update()
        self.writes.wait()

    def eval_rows(self, keys, tids) -> torch.Tensor:
        self.writes.wait()
        self._publish()
        self._kernel_space = None
        return super().eval_rows(keys, tids)

    def read(self, slots, tids) -> torch.Tensor:
        self.writes.wait()
        self._publish()
        return super().read(slots, tids)

    def flush(self) -> None:
        self._finish()

    def purge(self) -> None:
        self._finish()

    def import_rows(self, table, keys, scores, embeddings, optimizer_state, init):
        self._finish()
        return super().import_rows(table, keys, scores, embeddings, optimizer_state, init)

    def clear_tables(self, tables: Sequence[int]) -> None:
        self._finish()
        super().clear_tables(tables)

    def reserve_rows(self, table: int, incoming: int) -> None:
        self._finish()
        super().reserve_rows(table, incoming)

    def snapshot(self) -> dict:
        self._finish()
        return super().snapshot()

    def settle(self, writing: bool) -> None:
        self._finish()
