"""Helpers shared by the table tests: state snapshots, comparisons
of a ScoredHashTable with the pure-Python model."""

import torch

from dynamicemb.table import ScoredHashTable, enums
from tests.table import table_model as M

STATE_TENSORS = ("keys", "digests", "scores", "counters", "free_rows", "info")


def i64(values, device="cpu") -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=device)


def raw_run(t: ScoredHashTable, keys, op: int, victim_scores=None, held_slots=None):
    """The raw table_run op (no Python checks) of one batch on table 0 of
    ``t``, every policy NONE."""
    n, w = len(keys), t.num_scores
    return torch.ops.dynamicemb.table_run(
        i64(keys),
        i64([0] * n),
        t.keys,
        t.digests,
        t.scores,
        t.info,
        t.counters,
        t.free_rows,
        [0] * w,
        torch.zeros((1, w), dtype=torch.int64),
        op,
        False,
        t.total_buckets,
        False,
        victim_scores,
        None,
        False,
        held_slots,
    )


def snapshot(table: ScoredHashTable) -> dict[str, object]:
    """Copies of every tensor of the table state, plus its Python layout."""
    snap = {k: getattr(table, k).detach().clone().cpu() for k in STATE_TENSORS}
    snap["layout"] = (
        table.num_tables,
        table.total_buckets,
        [table.capacity(t) for t in range(table.num_tables)],
        [table.bucket_capacity(t) for t in range(table.num_tables)],
        [table.row_capacity(t) for t in range(table.num_tables)],
    )
    return snap


def assert_same_snapshot(before: dict[str, object], after: dict[str, object]) -> None:
    assert before.keys() == after.keys()
    for k in before:
        if isinstance(before[k], torch.Tensor):
            assert before[k].dtype == after[k].dtype, k
            assert torch.equal(before[k], after[k]), f"{k} changed"
        else:
            assert before[k] == after[k], k


def status_names(status: torch.Tensor) -> list[str]:
    return [enums.InsertStatus(int(s)).name for s in status.cpu().tolist()]


def assert_matches_model(table: ScoredHashTable, model: M.TableModel) -> None:
    """The whole table state equals the model's."""
    assert [table.capacity(t) for t in range(table.num_tables)] == model.caps
    assert [table.bucket_capacity(t) for t in range(table.num_tables)] == model.widths
    assert [table.row_capacity(t) for t in range(table.num_tables)] == model.row_caps
    assert table.keys.cpu().tolist() == model.keys
    assert table.digests.cpu().tolist() == model.digests()
    assert table.scores.cpu().tolist() == model.scores
    counters = table.counters.cpu()
    assert counters[:, : M.NUM_COUNTERS].tolist() == model.counters
    assert not counters[:, M.NUM_COUNTERS :].any()
    assert table.count().cpu().tolist() == model.count()
    assert table.size().cpu().tolist() == model.count()
    col = enums.InfoCol
    free = table.free_rows.cpu()
    for t in range(table.num_tables):
        if table.is_no_eviction(t):
            off = int(table.info_host[t, col.ROW_OFFSET])
            top = int(counters[t, enums.CounterCol.FREE_TOP])
            assert free[off : off + top].tolist() == model.free_stack[t], f"free stack of {t}"


def assert_rows_consistent(table: ScoredHashTable) -> None:
    """NO_EVICTION tables: the rows of the stored keys are distinct, within the
    handed-out range, and not on the free stack; stack + rows in use = handed out.
    (Checked on the real table alone, independently of the model.)"""
    counters = table.counters.cpu()
    keys = table.keys.cpu()
    scores = table.scores.cpu()
    free = table.free_rows.cpu()
    empty = M.EMPTY_KEY
    for t in range(table.num_tables):
        if not table.is_no_eviction(t):
            continue
        lo, hi = table.slot_range(t)
        occupied = keys[lo:hi] != empty
        rows = scores[lo:hi, 0][occupied].tolist()
        nxt = int(counters[t, enums.CounterCol.NEXT_ROW])
        top = int(counters[t, enums.CounterCol.FREE_TOP])
        off = int(table.info_host[t, enums.InfoCol.ROW_OFFSET])
        stack = free[off : off + top].tolist()
        assert len(set(rows)) == len(rows), f"table {t}: a row is held by two keys"
        assert all(0 <= r < nxt for r in rows), f"table {t}: row out of [0, {nxt})"
        assert not set(rows) & set(stack), f"table {t}: a row in use is on the free stack"
        assert len(set(stack)) == len(stack)
        assert len(rows) + len(stack) == nxt
        assert nxt <= table.row_capacity(t)


def evicted_records(res) -> list[tuple]:
    ev = res.evicted.compact()
    return [
        (k, tuple(s), sl, t)
        for k, s, sl, t in zip(
            ev.keys.cpu().tolist(),
            ev.scores.cpu().tolist(),
            ev.slots.cpu().tolist(),
            ev.table_ids.cpu().tolist(),
        )
    ]


def exported_records(batch) -> list[tuple]:
    b = batch.compact()
    return [
        (k, sl, t, tuple(s))
        for k, sl, t, s in zip(
            b.keys.cpu().tolist(),
            b.slots.cpu().tolist(),
            b.table_ids.cpu().tolist(),
            b.scores.cpu().tolist(),
        )
    ]


def keys_in_bucket(table_capacity: int, width: int, bucket: int, count: int, start: int = 0):
    """The first `count` keys >= start whose home bucket is `bucket` (model hash)."""
    out, k = [], start
    while len(out) < count:
        if (M.bucket_hash(k) % table_capacity) // width == bucket:
            out.append(k)
        k += 1
    return out
