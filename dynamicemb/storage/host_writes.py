"""Rows on their way to host memory, off the training step's stream.

The rows a step sends to host memory (the victims a device cache evicts, a
hybrid table's staged rows after their update) go to scattered host rows. A
kernel writing them through the mapped pointer is slow (scattered writes over
the bus run at a fraction of its bandwidth) and, on the step's stream, holds
up everything after it. ``HostWrites`` takes those writes off that stream:

* ``stage``: on the step's stream, the rows are gathered from device memory
  into a staging buffer in device memory (a device-to-device copy), so that
  their device rows may be reused at once (a cache fills the slots its
  victims leave right after); ``queue`` takes rows already in such a buffer
  (a hybrid table's staged rows, nothing copied again);
* ``submit``: the staged rows are written to their host rows by one
  ``copy_rows`` on a side stream (the bus), after the work queued on the
  step's stream so far (an event), while the step goes on;
* ``wait``: whatever reads or writes those host rows next (the next training
  lookup, a prefetch, a flush, a checkpoint, an expansion that moves rows)
  makes its stream wait for the writes (an event: the host never waits).

Every write reaches its host rows in ascending address order (scattered
rows cross the bus about twice as fast so): ``stage`` sorts its entries by
destination once (``space.address_order``), so that the rows it writes at
once, its staging buffer and the writes ``submit`` makes are in that order;
``queue``-d rows are sorted when submitted.

A staged write whose destination is no longer its key's by the time it is
submitted (a key the same step inserted into a full host table evicted it:
the row is lost as it would have been, overwritten) is dropped
(``drop_moved``).

How many rows a step stages is known on the device only: a call stages at
most ``rows`` of its entries (a number the host keeps, which grows, in powers
of two, with the largest number of rows a call needed, read back from pinned
memory a step or more later, never waited for) and writes the rest at once
through the mapped pointer, as before. Which path a row takes changes no
result. ``max_rows`` caps ``rows`` (None: no cap). By default it is 0
(``AT_ONCE``): every row ``stage`` gets is written at once, on the step's
stream, which measured faster than the side stream (docs/storage.md, "Rows
over the bus"); ``queue``-d rows, already in device memory, still go on the
side stream. A hybrid table stages its rows (``max_rows`` None).

On the CPU there is no stream: a staged write runs at the next ``wait``, as
late as a GPU may run it, so that the CPU tests see any reader that does not
wait. A write staged while a CUDA graph is captured is ``take``-n by its
storage and put back (``put``) and submitted after each replay of the graph.
"""

import dataclasses
from dataclasses import dataclass

import torch

from dynamicemb.storage import space as sp
from dynamicemb.storage.layout import RowLayout

# ``max_rows`` by default: nothing staged, every row written at once.
AT_ONCE = 0
# Rows staged per call before anything was measured; ``rows`` never shrinks.
INITIAL_ROWS = 1024
# Head room over the largest number of rows a call needed.
_HEADROOM = 1.25


@dataclass
class StagedWrite:
    """Rows staged for a row space: row i of ``buffer`` goes to ``dst`` at
    ``dst_offsets[i]`` (-1: nowhere), ``nbytes[i]`` bytes. ``keys`` and
    ``slots`` (when given): whose row it is and the table slot it goes to,
    for ``drop_moved``; ``count``: () int64 on the device, the rows the call
    needed (all of its entries that had a row, staged or not)."""

    dst: tuple[torch.Tensor, torch.Tensor]
    dst_offsets: torch.Tensor
    buffer: torch.Tensor
    nbytes: torch.Tensor
    keys: torch.Tensor | None = None
    slots: torch.Tensor | None = None
    count: torch.Tensor | None = None
    captured: bool = False
    ordered: bool = False  # dst_offsets ascending already (``stage``)


class HostWrites:
    """Writes into host rows queued on a side stream (see the module
    docstring).

    Args:
        layout (RowLayout): the row format (the staging buffer's stride).
        device (torch.device): the storage's device.

    Attributes:
        max_rows (Optional[int]): at most this many rows staged per call
            (None: as many as ``rows``; by default ``AT_ONCE``, none).
        rows (int): the rows a call stages at most now.
    """

    def __init__(self, layout: RowLayout, device: torch.device) -> None:
        self.layout = layout
        self.device = device
        self.max_rows: int | None = AT_ONCE
        self.rows = INITIAL_ROWS
        self._pending: list[StagedWrite] = []
        self._cuda = device.type == "cuda"
        self._stream = None
        self._done = None
        if self._cuda:
            # The largest count a call needed, on the device, and its copy in
            # pinned memory, which the host reads without waiting.
            self._most = torch.zeros(1, dtype=torch.int64, device=device)
            self._most_host = torch.zeros(1, dtype=torch.int64).pin_memory()

    # -------------------------------------------------------------- sizes --

    def capacity(self, n: int, every: bool = False) -> int:
        """Rows to stage of a call of ``n`` entries: ``rows`` on a GPU, all
        of them on the CPU or with ``every``, at most ``max_rows``."""
        r = self.rows if self._cuda and not every else n
        if self.max_rows is not None:
            r = min(r, self.max_rows)
        return max(0, min(r, n))

    def _grow(self) -> None:
        """``rows`` after the largest count an earlier call needed (its copy
        in pinned memory, read without waiting: it may be a step old)."""
        want = int(int(self._most_host[0]) * _HEADROOM) + 1
        while self.rows < want:
            self.rows *= 2

    # ------------------------------------------------------------ staging --

    def stage(
        self,
        dst,
        dst_offsets: torch.Tensor,
        src,
        src_offsets: torch.Tensor,
        nbytes: torch.Tensor,
        keys: torch.Tensor | None = None,
        slots: torch.Tensor | None = None,
        count: torch.Tensor | None = None,
        every: bool = False,
    ) -> None:
        """Moves rows from the row space ``src`` to ``dst`` (entries with an
        offset at -1 skipped): the first ``capacity`` of them gathered now
        into a staging buffer and written by ``submit``, the rest written now.
        ``keys``/``slots``: see ``StagedWrite``; ``count``: () int64, the
        entries with a row (a valid prefix), or None; ``every``: stage every
        entry (a caller whose buffers are already that size). The entries are
        taken in ascending order of ``dst_offsets`` (those with a row first,
        in a valid prefix again)."""
        n = dst_offsets.numel()
        if n == 0:
            return
        order = sp.address_order(dst_offsets, (dst_offsets >= 0) & (src_offsets >= 0))
        dst_offsets, src_offsets, nbytes = dst_offsets[order], src_offsets[order], nbytes[order]
        keys = None if keys is None else keys[order]
        slots = None if slots is None else slots[order]
        r = self.capacity(n, every)
        if r < n:
            sp.copy_rows(dst, dst_offsets[r:], src, src_offsets[r:], nbytes[r:])
        if r == 0:
            return
        buf = torch.empty((r, self.layout.max_row_bytes), dtype=torch.uint8, device=self.device)
        sp.copy_rows(
            sp.as_space(buf),
            sp.staging_offsets(r, self.layout, self.device),
            src,
            src_offsets[:r],
            nbytes[:r],
        )
        if self._cuda and count is not None:
            torch.maximum(self._most, count.reshape(1), out=self._most)
        self._pending.append(
            StagedWrite(
                dst,
                torch.where(src_offsets[:r] >= 0, dst_offsets[:r], -1),
                buf,
                nbytes[:r],
                None if keys is None else keys[:r],
                None if slots is None else slots[:r],
                count,
                self._cuda and torch.cuda.is_current_stream_capturing(),
                ordered=True,
            )
        )

    def queue(self, dst, dst_offsets: torch.Tensor, buffer: torch.Tensor, nbytes) -> None:
        """Rows already in a staging buffer (row i of ``buffer`` to ``dst``
        at ``dst_offsets[i]``, -1 skipped), written by ``submit`` (in
        address order)."""
        if dst_offsets.numel():
            self._pending.append(StagedWrite(dst, dst_offsets, buffer, nbytes))

    def drop_moved(self, keys_at: torch.Tensor) -> None:
        """Drops the staged rows whose slot no longer holds their key
        (``keys_at``: the table's key of every slot)."""
        capturing = self._cuda and torch.cuda.is_current_stream_capturing()
        for w in self._pending:
            # Inside a capture, the writes it staged (the graph's tensors);
            # outside, the eager ones (never a failed capture's, whose slots
            # were never written).
            if w.keys is None or w.captured != capturing:
                continue
            held = keys_at[w.slots.clamp(min=0)] == w.keys
            w.dst_offsets = torch.where(held & (w.slots >= 0), w.dst_offsets, -1)

    # ------------------------------------------------------------ streams --

    def take(self) -> list[StagedWrite]:
        """The writes a CUDA graph's capture staged (its own tensors, written
        after each replay: ``put``), which are no longer this queue's."""
        out = [w for w in self._pending if w.captured]
        self._pending = [w for w in self._pending if not w.captured]
        return out

    def put(self, writes: list[StagedWrite]) -> None:
        """Stages ``writes`` again (a replayed graph's, whose kernels ran)."""
        self._pending.extend(dataclasses.replace(w, captured=False) for w in writes)

    def _ready(self) -> list[StagedWrite]:
        """The pending writes, without those of a capture that failed (its
        kernels never ran: nothing to write)."""
        out = [w for w in self._pending if not w.captured]
        self._pending = []
        return out

    def _write(self, w: StagedWrite) -> None:
        """Copies a staged write's rows to their host rows, in address order."""
        off = sp.staging_offsets(w.dst_offsets.numel(), self.layout, self.device)
        by = None if w.ordered else "dst"
        sp.copy_rows(w.dst, w.dst_offsets, sp.as_space(w.buffer), off, w.nbytes, by=by)

    def submit(self) -> None:
        """Writes the staged rows to their host rows on the bus stream (after
        the current stream's work so far); on the CPU they wait for
        ``wait``. Nothing is submitted while a CUDA graph is captured."""
        if not self._cuda or torch.cuda.is_current_stream_capturing():
            return
        self._grow()
        writes = self._ready()
        if not writes:
            return
        current = torch.cuda.current_stream(self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        bus = self._stream
        bus.wait_stream(current)
        with torch.cuda.stream(bus):
            for w in writes:
                for t in (w.dst_offsets, w.buffer, w.nbytes):
                    t.record_stream(bus)
                self._write(w)
            self._most_host.copy_(self._most, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record(bus)

    def wait(self) -> None:
        """Orders what the current stream does next after every write staged
        so far (on the CPU: runs them now)."""
        if not self._cuda:
            for w in self._ready():
                self._write(w)
            return
        if torch.cuda.is_current_stream_capturing():
            return  # waited for before the capture (a graph replays after a wait)
        self.submit()
        if self._done is not None:
            torch.cuda.current_stream(self.device).wait_event(self._done)
