"""dynamicemb's counter: the ``KVCounter`` shares of the tables an admission
strategy serves, fused into one scored hash table.

The counter is the table layer itself (``ScoredHashTable``, one score word per
slot holding the count, no values), so keys hash, probe and live in their home
bucket exactly as an embedding table's keys do, and a full bucket evicts its
smallest count. Counting is one op, ``torch.ops.dynamicemb.counter_add``
(cc/admission), run bucket by bucket like the table's inserts: the CPU kernel
is the reference the CUDA one is tested against.
"""

import contextlib
import io
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dynamicemb._checks import as_int, as_tensor, is_int
from dynamicemb.dynamicemb_config import BUCKET_ALIGNMENT, align_to_table_size
from dynamicemb.storage import Footprint, by_memory, table_metadata_bytes
from dynamicemb.table import ScoredHashTable, check_keys, enums, first_repeat, ops
from dynamicemb.types import Counter, KVCounter, MemoryType

__all__ = [
    "MultiTableKVCounter",
    "check_kv_counter",
    "counter_layout",
    "counter_entries",
    "counter_key_type",
    "parse_counter_files",
    "replace_counter_entries",
    "restore_counter_entries",
]

# release_at of a plain add: no count reaches it.
_NEVER = 2**63 - 1

# Slots exported per step of a dump (bounds the memory a dump takes).
_DUMP_SLOTS = 1 << 20

# dtype of the counts in a dump's counter file.
COUNT_DTYPE = torch.int64


def check_kv_counter(counter: KVCounter, owner: str) -> None:
    """Raises ValueError unless the counter's buckets are whole digest groups
    (a multiple of ``BUCKET_ALIGNMENT``), as the table layer needs."""
    if counter.bucket_capacity % BUCKET_ALIGNMENT:
        raise ValueError(
            f"{owner}: the counter's bucket_capacity must be a multiple of "
            f"{BUCKET_ALIGNMENT}, got {counter!r}"
        )


def counter_layout(counter: KVCounter) -> tuple[int, int]:
    """(slots, bucket width) of a counter share, by the table's bucket rules:
    ``capacity`` rounded up to whole buckets of ``bucket_capacity``; a
    capacity smaller than a bucket is one bucket of that capacity (rounded up
    to a multiple of ``BUCKET_ALIGNMENT``, as one bucket spanning a table is)."""
    if counter.capacity < counter.bucket_capacity:
        width = align_to_table_size(counter.capacity, BUCKET_ALIGNMENT)
        return width, width
    return align_to_table_size(counter.capacity, counter.bucket_capacity), counter.bucket_capacity


class MultiTableKVCounter(Counter):
    """The fused counter of several tables, built from their ``KVCounter`` objects.

    Table ``t`` of the counter has ``kv_counters[t].capacity`` slots (rounded
    up to whole buckets) in buckets of ``kv_counters[t].bucket_capacity``, or
    one bucket of its capacity when that is smaller (``counter_layout``).
    A key's count lives in its home bucket; a key that enters a full bucket
    evicts the bucket's smallest count (the first such slot on a tie) that
    the same call has not found or filled, and is not stored when there is
    none. Within a call the keys are counted one after another, bucket by
    bucket in call order (see ``add_and_release``), on the CPU and CUDA alike.

    Args:
        kv_counters (Sequence[KVCounter]): one per table, in table-id order;
            they agree on ``key_type`` (the dtype of a dump's key file).
        device (Optional[torch.device]): where the counter lives.

    Raises:
        TypeError: an entry is not a KVCounter (named with its index).
        ValueError: no entry, a bucket capacity that is not a multiple of 16,
            or the key types differ.

    Example::

        counter = MultiTableKVCounter([KVCounter(1 << 16), KVCounter(1 << 12)])
        counter.add(keys, table_ids, torch.ones_like(keys))   # counts after the add
    """

    def __init__(
        self, kv_counters: Sequence[KVCounter], device: str | torch.device | None = None
    ) -> None:
        kv_counters = list(kv_counters)
        if not kv_counters:
            raise ValueError("MultiTableKVCounter needs at least one KVCounter")
        for t, c in enumerate(kv_counters):
            if not isinstance(c, KVCounter):
                raise TypeError(f"MultiTableKVCounter: entry {t} must be a KVCounter, got {c!r}")
            check_kv_counter(c, f"MultiTableKVCounter entry {t}")
        key_types = {c.key_type for c in kv_counters}
        if len(key_types) != 1:
            raise ValueError(
                f"the KVCounters of one fused counter must share key_type, got {kv_counters!r}"
            )
        self.kv_counters = kv_counters
        self.key_type: torch.dtype = kv_counters[0].key_type
        layouts = [counter_layout(c) for c in kv_counters]
        self.table = ScoredHashTable(
            [slots for slots, _ in layouts],
            bucket_capacities=[width for _, width in layouts],
            num_scores=1,
            device=device,
            validate=False,
        )
        self.device = self.table.device

    @property
    def num_tables(self) -> int:
        return self.table.num_tables

    # ------------------------------------------------------------ inputs --

    def _batch(self, keys, table_ids, frequencies=None):
        for name, x in (("keys", keys), ("table_ids", table_ids), ("frequencies", frequencies)):
            if x is None and name == "frequencies":
                continue
            if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.is_complex():
                got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
                raise TypeError(f"MultiTableKVCounter: {name} must be an integer tensor, got {got}")
            as_tensor(x, f"MultiTableKVCounter: {name}")  # refuses the meta device
            if x.dim() != 1 or x.shape != keys.shape:
                raise ValueError(
                    f"MultiTableKVCounter: {name} must be 1-D with one entry per key "
                    f"({keys.numel()}), got shape {tuple(x.shape)}"
                )
        keys = keys.to(self.device, torch.int64).contiguous()
        table_ids = table_ids.to(self.device, torch.int64).contiguous()
        if frequencies is None:
            return keys, table_ids
        return keys, table_ids, frequencies.to(self.device, torch.int64).contiguous()

    def _check_table_id(self, table_id: Any) -> int:
        if not is_int(table_id) or not 0 <= table_id < self.num_tables:
            raise ValueError(
                f"MultiTableKVCounter: table_id must be an int in [0, {self.num_tables}), "
                f"got {table_id!r}"
            )
        return table_id

    # -------------------------------------------------------- operations --

    def add_and_release(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        frequencies: torch.Tensor,
        threshold: int,
    ) -> torch.Tensor:
        """Adds frequencies; keys whose count reaches ``threshold`` leave.

        Keys are taken one after another (bucket by bucket): first every
        occurrence of a stored key, then the others, each group in call order;
        an occurrence of a key released earlier in the call counts as new.
        Each key's count becomes its stored count (0 if absent) plus its
        frequency. A count at or above ``threshold`` leaves the counter (a
        stored key is erased, an absent one is not stored); a lower count is
        stored, an absent key taking a free slot of its bucket, else evicting
        the bucket's smallest count that this call has not found or filled,
        else not stored. An admission strategy admits exactly the keys whose
        returned count reaches its threshold.

        Args:
            keys (torch.Tensor): (n) integer keys.
            table_ids (torch.Tensor): (n) integer, each key's table.
            frequencies (torch.Tensor): (n) integer, non-negative increments.
            threshold (int): the count at which a key leaves.

        Returns:
            torch.Tensor: (n) int64 count of each key after its increment, on
            the counter's device.
        """
        threshold = as_int(threshold, "threshold", min=0)
        keys, table_ids, frequencies = self._batch(keys, table_ids, frequencies)
        return ops().counter_add(
            keys, table_ids, *self.state_tensors(), frequencies, threshold, self.table.total_buckets
        )

    def admit_missing(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        frequencies: torch.Tensor,
        threshold: int,
        store: ScoredHashTable,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Admission's one pass over a batch (one op, ``counter_admit``,
        cc/admission/counter.h): each entry is looked up in ``store``; the
        keys it does not hold are counted as ``add_and_release(..,
        threshold)`` counts them when given alone, in batch order, and a key
        whose count reaches ``threshold`` is admitted (it leaves the counter).
        Nothing is read on the host.

        Args:
            keys (torch.Tensor): (n) int64 distinct keys on the counter's
                device; ``PAD_KEY`` marks padding (dynamicemb.table.pad_key).
            table_ids (torch.Tensor): (n) int64, each key's table.
            frequencies (torch.Tensor): (n) int64 increments.
            threshold (int): the count that admits, >= 0.
            store (ScoredHashTable): the embedding table (the counter's tables,
                on its device), read only.

        Returns:
            (status, per_table): (n) int8 ``enums.Admission`` of each entry
            (STORED, ADMITTED, REJECTED, NONE for padding) and (num_tables, 2)
            int64, the entries admitted and rejected per table.
        """
        threshold = as_int(threshold, "threshold", min=0)
        store_state = (store.keys, store.digests, store.scores, store.info)
        return ops().counter_admit(
            keys,
            table_ids,
            *store_state,
            *self.state_tensors(),
            frequencies,
            threshold,
            self.table.total_buckets,
        )

    def state_tensors(self) -> tuple[torch.Tensor, ...]:
        """The counter table's tensors the ops take and write (keys, digests,
        counts, layout, counters): a CUDA graph of a step that counts replays
        over them (dynamicemb/embedding/cuda_graphs.py)."""
        t = self.table
        return (t.keys, t.digests, t.scores, t.info, t.counters)

    def add(
        self, keys: torch.Tensor, table_ids: torch.Tensor, frequencies: torch.Tensor
    ) -> torch.Tensor:
        """Adds frequencies to these keys and returns their accumulated counts
        (``add_and_release`` with no threshold: every key stays, space
        permitting; a key that is not stored returns its frequency)."""
        return self.add_and_release(keys, table_ids, frequencies, _NEVER)

    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        """Erases these keys (keys not counted are ignored)."""
        keys, table_ids = self._batch(keys, table_ids)
        self.table.erase(keys, table_ids)

    def get(self, keys: torch.Tensor, table_ids: torch.Tensor) -> torch.Tensor:
        """(n) int64 stored count of each key, 0 where it is not counted."""
        keys, table_ids = self._batch(keys, table_ids)
        slots = self.table.find(keys, table_ids)
        counts = self.table.scores[slots.clamp(min=0), 0]
        return torch.where(slots >= 0, counts, torch.zeros_like(counts))

    def size(self) -> torch.Tensor:
        """(num_tables) keys counted per table, from the device counters."""
        return self.table.size()

    def evictions(self) -> torch.Tensor:
        """(num_tables) keys evicted by full buckets so far, per table."""
        return self.table.counter("EVICTIONS")

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes of ``mem_type`` memory the counter holds: its table's keys,
        digests, counts and layout, on its device (host memory on the CPU)."""
        return sum(self.memory_per_table(mem_type))

    def memory_per_table(self, mem_type: MemoryType = MemoryType.DEVICE) -> list[int]:
        """Bytes of ``mem_type`` memory each table's share of the counter takes
        (``table_metadata_bytes`` of a counter table: one score word)."""
        return [
            by_memory(Footprint(device=table_metadata_bytes([c], 1, [0]), host=0), mem_type, d)
            for c, d in ((self.table.capacity(t), self.device) for t in range(self.num_tables))
        ]

    # ------------------------------------------------------- dump / load --

    def dump(self, key_file, counter_file, table_id: int) -> None:
        """Dumps one table's keys and counts to these files.

        The key file gets the keys as a flat native-endian array of
        ``key_type``, the counter file their counts as int64, in the same
        order (slot order). A file is a path or a binary file object open for
        writing; paths are created or truncated.

        Raises:
            ValueError: ``table_id`` is not one of the counter's tables.
        """
        table_id = self._check_table_id(table_id)
        lo, hi = self.table.slot_range(table_id)
        key_np = torch.empty(0, dtype=self.key_type).numpy().dtype
        with _open(key_file, "wb") as kf, _open(counter_file, "wb") as cf:
            for begin in range(lo, hi, _DUMP_SLOTS):
                batch = self.table.export_batch(begin, min(hi, begin + _DUMP_SLOTS)).compact()
                kf.write(batch.keys.cpu().numpy().astype(key_np).tobytes())
                cf.write(batch.scores[:, 0].cpu().to(COUNT_DTYPE).numpy().tobytes())

    def load(self, key_file, counter_file, table_id: int) -> None:
        """Loads one table's keys and counts from these files (the format of
        ``dump``).

        Each loaded key gets the loaded count (replacing a count it has);
        keys not in the files keep theirs. A key whose bucket has no room
        evicts the smallest count not loaded by this call, or is left out
        (with a warning saying how many were).

        Raises:
            ValueError: ``table_id`` is not one of the counter's tables, the
                files' sizes do not hold whole, equally many entries, or a key
                is reserved or repeated, or a count is negative. Nothing is
                changed then.
        """
        table_id = self._check_table_id(table_id)
        with _open(key_file, "rb") as kf, _open(counter_file, "rb") as cf:
            keys, counts = parse_counter_files(
                kf.read(), cf.read(), self.key_type, "MultiTableKVCounter.load"
            )
        if keys.numel() == 0:
            return
        res = self.table.insert_and_evict(
            keys.to(self.device),
            torch.full_like(keys, table_id).to(self.device),
            policies=[enums.ScorePolicy.ASSIGN],
            scores=counts.reshape(-1, 1).to(self.device),
        )
        left_out = int((res.status == enums.InsertStatus.FAILED).sum())
        if left_out:
            warnings.warn(
                f"MultiTableKVCounter.load: {left_out} of {keys.numel()} keys of table "
                f"{table_id} found no room in their buckets and were not loaded",
                stacklevel=2,
            )


@contextlib.contextmanager
def _open(f, mode: str):
    """A path opened in ``mode`` (closed after), or a file object as it is."""
    if isinstance(f, (str, bytes, os.PathLike)):
        with open(f, mode) as opened:
            yield opened
    else:
        yield f


# ----------------------------------------------- counters in checkpoints --
# What the checkpoint and a load's rollback know of a Counter, through the
# spec's interface only (dump, load, erase): its dump writes a flat array of
# its keys (at its ``key_type``; int64 for a counter without one) and their
# counts as int64, in the same order; its load reads the same.


def counter_key_type(counter: Counter) -> torch.dtype:
    """The dtype of the keys ``counter.dump`` writes: its ``key_type``, int64
    for a counter that has none."""
    return getattr(counter, "key_type", torch.int64)


def parse_counter_files(
    key_bytes: bytes, count_bytes: bytes, key_type: torch.dtype, where: str = "counter files"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (n) int64 keys and (n) int64 counts of a counter's dump.

    Raises:
        ValueError: the sizes do not hold whole, equally many entries, a key
            is reserved or repeated, or a count is negative (each named).
    """
    key_np = torch.empty(0, dtype=key_type).numpy().dtype
    item = np.dtype(np.int64).itemsize
    if len(key_bytes) % key_np.itemsize or len(count_bytes) % item:
        raise ValueError(
            f"{where}: the key file ({len(key_bytes)} bytes) must hold whole {key_np} keys and "
            f"the counter file ({len(count_bytes)} bytes) whole int64 counts"
        )
    keys = torch.from_numpy(np.frombuffer(key_bytes, dtype=key_np).astype(np.int64))
    counts = torch.from_numpy(np.frombuffer(count_bytes, dtype=np.int64).copy())
    if keys.numel() != counts.numel():
        raise ValueError(f"{where}: {keys.numel()} keys but {counts.numel()} counts")
    check_counter_entries(keys, counts, where)
    return keys, counts


def check_counter_entries(keys: torch.Tensor, counts: torch.Tensor, where: str) -> None:
    """Raises ValueError naming the first reserved or repeated key or
    negative count."""
    check_keys(keys, where)
    bad = counts < 0
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"{where}: key {int(keys[i])} at index {i} has a negative count ({int(counts[i])})"
        )
    repeat = first_repeat(keys)
    if repeat is not None:
        i, times = repeat
        raise ValueError(f"{where}: key {int(keys[i])} at index {i} appears {times} times")


def counter_entries(counter: Counter, table_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One table's (n) int64 keys and (n) int64 counts, through ``dump``."""
    kf, cf = io.BytesIO(), io.BytesIO()
    counter.dump(kf, cf, table_id)
    return parse_counter_files(
        kf.getvalue(), cf.getvalue(), counter_key_type(counter), f"{type(counter).__name__}.dump"
    )


def replace_counter_entries(
    counter: Counter, table_id: int, keys: torch.Tensor, counts: torch.Tensor
) -> None:
    """Makes ``keys`` with ``counts`` one table's only entries: erases the
    keys it counts (``erase``), then loads these (``load``)."""
    old, _ = counter_entries(counter, table_id)
    if old.numel():
        counter.erase(old, torch.full_like(old, table_id))
    key_np = torch.empty(0, dtype=counter_key_type(counter)).numpy().dtype
    kf = io.BytesIO(keys.cpu().numpy().astype(key_np).tobytes())
    cf = io.BytesIO(counts.cpu().to(COUNT_DTYPE).numpy().tobytes())
    counter.load(kf, cf, table_id)


def restore_counter_entries(
    counter: Counter, table_id: int, keys: torch.Tensor, counts: torch.Tensor
) -> None:
    """``replace_counter_entries`` for a rollback, which must leave the table
    whole: when the counter's ``load`` fails, its entries go back through
    ``erase`` and ``add`` (a count added to a key not counted is that count).

    Raises:
        Exception: the ``load``'s error, when that way fails too.
    """
    try:
        replace_counter_entries(counter, table_id, keys, counts)
        return
    except Exception as e:
        error = e
    try:
        current, _ = counter_entries(counter, table_id)
        if current.numel():
            counter.erase(current, torch.full_like(current, table_id))
        if keys.numel():
            device = getattr(counter, "device", keys.device)
            k = keys.to(device)
            counter.add(k, torch.full_like(k, table_id), counts.to(device, COUNT_DTYPE))
        got_keys, got_counts = counter_entries(counter, table_id)
        order, got_order = torch.argsort(keys.cpu()), torch.argsort(got_keys)
        if not (
            torch.equal(keys.cpu()[order], got_keys[got_order])
            and torch.equal(counts.cpu().to(COUNT_DTYPE)[order], got_counts[got_order])
        ):
            raise RuntimeError("the counter's entries differ after erase and add")
    except Exception:
        raise error from None
