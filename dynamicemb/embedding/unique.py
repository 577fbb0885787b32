"""Segmented unique: the distinct (table, key) pairs of a batch, per table.

The embedding step looks every distinct key up once, reduces the gradients
of its occurrences into one, and counts how often it occurred (LFU scores,
admission). This is that step, on any device: the op ``segmented_unique``,
one call: on the CPU (cc/embedding/unique_cpu.h) a stable sort by key, a
counting sort by table, the pairs of each table ordered by first occurrence
and one pass; on CUDA (cc/embedding/unique_cuda.h) a hash set of the pairs
that keeps each pair's first position, one stable radix sort of (table,
first position) and the passes around one scan. Both give the pairs table
by table, within a table in the order of their first occurrences.

How many distinct keys a batch has is known on the device only. Reading it
on the host would stall the host until the device has caught up, so the
training step works with *padded* results (``padded=True``): every output
has the batch's length (its upper bound), the distinct keys first, then
padding: the key ``PAD_KEY`` (a reserved key, which the CUDA table kernels
treat as invalid: slot -1, nothing stored), the last table's id, count 0.
``num_unique`` holds the number of distinct keys on the device.
"""

import os
from dataclasses import dataclass

import torch

from dynamicemb.table import PAD_KEY, ops


@dataclass
class SegmentedUnique:
    """Distinct keys of a batch, grouped by table.

    Attributes:
        keys (torch.Tensor): (u) int64, table by table, within a table in the
            order of their first occurrences in the batch.
        table_ids (torch.Tensor): (u) int64, non-decreasing.
        inverse (torch.Tensor): (n) int64, ``keys[inverse] == input keys``.
        counts (torch.Tensor): (u) int64 occurrences of each distinct key.
        table_offsets (torch.Tensor): (num_tables + 1) int64: table t's keys are
            ``keys[table_offsets[t]:table_offsets[t + 1]]``.
        order (torch.Tensor): (n) int64, the input positions grouped by distinct
            key: those of key u are ``order[sum(counts[:u]) : sum(counts[:u + 1])]``,
            ascending.
        num_unique (torch.Tensor): (1) int64 on the keys' device, the number
            of distinct keys: ``u`` itself, or, padded (u = n), the length of
            the prefix that holds them.
        occ_offsets (torch.Tensor): (u + 1) int64, where each distinct key's
            positions start in ``order``: ``[0] + cumsum(counts)``.
    """

    keys: torch.Tensor
    table_ids: torch.Tensor
    inverse: torch.Tensor
    counts: torch.Tensor
    table_offsets: torch.Tensor
    order: torch.Tensor
    num_unique: torch.Tensor
    occ_offsets: torch.Tensor

    def valid(self) -> torch.Tensor:
        """(u) bool: the entry is a distinct key (not padding): one comparison
        with the padding key, which no batch may hold."""
        return self.keys != PAD_KEY


def segmented_unique(
    keys: torch.Tensor, table_ids: torch.Tensor, num_tables: int, padded: bool = False
) -> SegmentedUnique:
    """Distinct (table, key) pairs of a batch.

    Args:
        keys (torch.Tensor): (n) int64.
        table_ids (torch.Tensor): (n) int64 in [0, num_tables).
        num_tables (int): tables the batch may address.
        padded (bool): keep every output at the batch's length, padded (see
            the module docstring), without reading the number of distinct keys
            on the host; otherwise the outputs have exactly that length (on
            CUDA reading it synchronizes).

    With the environment variable DYNAMICEMB_DEBUG set, the table offsets are
    checked on the host (0 first, the number of distinct keys last,
    non-decreasing) and a violation raises.
    """
    if keys.dtype != torch.int64 or table_ids.dtype != torch.int64:
        raise TypeError(f"keys and table_ids must be int64, got {keys.dtype} and {table_ids.dtype}")
    if keys.dim() != 1 or keys.shape != table_ids.shape:
        raise ValueError(
            f"keys and table_ids must be 1-D of one length, got {tuple(keys.shape)} and "
            f"{tuple(table_ids.shape)}"
        )
    if num_tables < 1:
        raise ValueError(f"num_tables must be positive, got {num_tables}")
    # The op's results are the fields, in their order.
    su = SegmentedUnique(*ops().segmented_unique(keys, table_ids, num_tables, PAD_KEY))
    if not padded:
        u = int(su.num_unique)  # synchronizes on CUDA
        su.keys, su.table_ids, su.counts = su.keys[:u], su.table_ids[:u], su.counts[:u]
        su.occ_offsets = su.occ_offsets[: u + 1]
    if os.environ.get("DYNAMICEMB_DEBUG"):
        _check_offsets(su.table_offsets, int(su.num_unique), num_tables)
    return su


def _check_offsets(offsets: torch.Tensor, num_keys: int, num_tables: int) -> None:
    o = offsets.cpu()
    if int(o[0]) != 0:
        raise RuntimeError(f"segmented_unique: table_offsets[0] is {int(o[0])}, not 0")
    if int(o[num_tables]) != num_keys:
        raise RuntimeError(
            f"segmented_unique: table_offsets[{num_tables}] is {int(o[num_tables])}, "
            f"not the {num_keys} distinct keys (a table id is out of range)"
        )
    if bool((o[1:] < o[:-1]).any()):
        raise RuntimeError(f"segmented_unique: table_offsets decrease: {o.tolist()}")
