"""NO_EVICTION value rows stay consistent whatever the caller does: a row is
held by at most one key, assigned rows are refused when held or repeated, the
allocator never hands out a held row, state tensors with impossible counters
are refused instead of crashing the process, and fused tables read their own
rows. The crash reproducers run in a child interpreter, so a regression fails
the test instead of ending the session."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from dynamicemb.table import ScoredHashTable, enums
from tests.devices import DEVICES
from tests.table import table_model as M
from tests.table.table_testlib import (
    assert_rows_consistent,
    assert_same_snapshot,
    i64,
    snapshot,
    status_names,
)

OPS = torch.ops.dynamicemb
NEXT_ROW, FREE_TOP, SIZE = M.NEXT_ROW, M.FREE_TOP, M.SIZE


def _child(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _two_small_tables(device):
    return ScoredHashTable(
        [64, 64], bucket_capacities=16, no_eviction=True, row_capacities=[4, 4], device=device
    )


@pytest.mark.parametrize("device", DEVICES)
def test_forty_keys_on_one_assigned_row_are_refused_and_the_process_survives(device):
    # Found: the process aborted (free(): invalid next size) in the erase.
    out = _child(f"""
        import torch
        from dynamicemb.table import ScoredHashTable
        t = ScoredHashTable([64, 64], bucket_capacities=16, no_eviction=True,
                            row_capacities=[4, 4], device="{device}")
        k = torch.arange(1, 41, device="{device}")
        z = torch.zeros(40, dtype=torch.long, device="{device}")
        state = lambda: (t.keys, t.scores, t.counters, t.free_rows)
        before = [x.clone() for x in state()]
        try:
            t.insert(k, z, scores=z[:, None], assign_rows=True)
        except ValueError as e:
            print("ValueError:", e)
        t.erase(k, z)
        same = all(torch.equal(a, b) for a, b in zip(before, state()))
        print("unchanged" if same else "changed")
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ValueError: dynamicemb: row 0 at index 1 is given to key 1 at index 0" in out.stdout, (
        out.stdout + out.stderr[-2000:]
    )
    assert out.stdout.strip().endswith("unchanged"), out.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_held_by_another_key_cannot_be_assigned(device):
    # Found: keys 100 and 200 both on row 0; after erasing both, the next two
    # keys got row 0 twice.
    t = _two_small_tables(device)
    t.insert(i64([100], device), i64([0], device), scores=i64([[0]], device), assign_rows=True)
    before = snapshot(t)
    with pytest.raises(ValueError, match=r"row 0 at index 0 is held by key 100 of table 0"):
        t.insert(i64([200], device), i64([0], device), scores=i64([[0]], device), assign_rows=True)
    assert_same_snapshot(before, snapshot(t))
    # The same row in the other table is free.
    t.insert(i64([200], device), i64([1], device), scores=i64([[0]], device), assign_rows=True)
    t.erase(i64([100, 200], device), i64([0, 1], device))
    res = t.insert(i64([300, 301], device), i64([0, 0], device))
    assert t.rows(res.slots).tolist() == [0, 1]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
def test_assigned_rows_of_resident_keys_and_repeats_are_not_double_assignments(device):
    t = _two_small_tables(device)
    t.insert(i64([5], device), i64([0], device), scores=i64([[2]], device), assign_rows=True)
    # 5 is resident (its row 2 stays; the 3 given is ignored); 6 twice: one key.
    res = t.insert(
        i64([5, 6, 6], device),
        i64([0, 0, 0], device),
        scores=i64([[3], [3], [1]], device),
        assign_rows=True,
    )
    assert status_names(res.status) == ["FOUND", "INSERTED", "FOUND"]
    assert t.rows(res.slots).tolist() == [2, 3, 3]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
def test_the_allocator_hands_out_no_assigned_row(device):
    t = ScoredHashTable(
        [64], bucket_capacities=16, no_eviction=True, row_capacities=8, device=device
    )
    t.insert(i64([5, 6], device), scores=i64([[3], [1]], device), assign_rows=True)
    # Rebuilt from the rows held: next row 4, free rows 0 and 2, lowest first.
    assert t.counters[0, NEXT_ROW].item() == 4 and t.counters[0, FREE_TOP].item() == 2
    res = t.insert(i64([7, 8, 9, 10], device))
    assert t.rows(res.slots).tolist() == [0, 2, 4, 5]
    assert_rows_consistent(t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "column, value, match",
    [
        (FREE_TOP, 10**12, r"free-row top 1000000000000 of table 0 is not within \[0, 2\]"),
        (NEXT_ROW, 5, r"next row 5 of table 0 is not within \[0, 4\]"),
        (SIZE, -1, r"size -1 of table 0 is not within \[0, 64\]"),
    ],
    ids=["free_top", "next_row", "size"],
)
def test_state_with_impossible_counters_is_refused_not_crashing(device, column, value, match):
    # Found: a free-row top of 10^12 made table_run segfault.
    out = _child(f"""
        import torch
        from dynamicemb.table import ScoredHashTable
        t = ScoredHashTable([64, 64], bucket_capacities=16, no_eviction=True,
                            row_capacities=[4, 4], device="{device}")
        t.insert(torch.tensor([1, 2], device="{device}"), torch.tensor([0, 0], device="{device}"))
        t.counters[0, {column}] = {value}
        state = lambda: (t.keys, t.scores, t.counters, t.free_rows)
        before = [x.clone() for x in state()]
        k = torch.arange(10, 20, device="{device}")
        try:
            res = t.insert(k, torch.zeros_like(k))
            print("statuses", sorted(set(res.status.tolist())))
        except ValueError as e:
            print("ValueError:", e)
        same = all(torch.equal(a, b) for a, b in zip(before, state()))
        print("unchanged" if same else "changed")
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    if device == "cpu":
        assert "ValueError: dynamicemb: counters: " in out.stdout, out.stdout + out.stderr
        assert re.search(match, out.stdout), out.stdout
    else:  # the CUDA kernels refuse the whole call without synchronizing
        assert f"statuses [{int(enums.InsertStatus.INVALID)}]" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("unchanged"), out.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_free_row_entry_out_of_range_fails_the_key_instead_of_writing_it(device):
    t = _two_small_tables(device)
    t.insert(i64([1, 2], device), i64([0, 0], device))
    t.erase(i64([1], device), i64([0], device))
    t.free_rows[0] = 10**9  # a corrupted stack entry
    res = t.insert(i64([50], device), i64([0], device))
    assert status_names(res.status) == ["FAILED"]
    assert t.find(i64([50], device), i64([0], device)).tolist() == [-1]


@pytest.mark.parametrize("device", DEVICES)
def test_find_gather_of_fused_no_eviction_tables_reads_each_tables_rows(device):
    # Found: the row offset of table 1 was ignored, keys of both tables read row 0.
    t = _two_small_tables(device)
    t.insert(i64([5, 6], device), i64([0, 1], device))
    values = torch.arange(8.0, device=device).reshape(8, 1)  # table 0: rows 0-3, table 1: 4-7
    slots, rows = t.find_gather(i64([5, 6, 7], device), values, i64([0, 1, 1], device))
    assert rows.flatten().tolist() == [0.0, 4.0, 0.0]
    assert slots[2].item() == -1
    # The same rows through the raw op.
    c = torch.zeros(1, 1, dtype=torch.int64, device=device)
    _, rows = OPS.table_find_gather(
        i64([5, 6], device),
        i64([0, 1], device),
        t.keys,
        t.digests,
        t.scores,
        t.info,
        [0],
        c,
        False,
        values,
    )
    assert rows.flatten().tolist() == [0.0, 4.0]


@pytest.mark.parametrize(
    "existing, keys, tables, rows",
    [
        ([], list(range(1, 41)), [0] * 40, [0] * 40),
        ([(100, 0, 0)], [200], [0], [0]),
        ([(100, 0, 0)], [100, 300, 301], [0, 1, 1], [3, 2, 2]),
        ([(7, 1, 3)], [8, 9, 8], [1, 1, 1], [2, 3, 2]),
        ([], [5, 6], [0, 1], [0, 9]),
    ],
    ids=["forty_on_one_row", "held", "resident_ignored_then_twice", "repeat_is_one_key", "range"],
)
def test_the_checked_python_path_gives_the_cpu_kernels_verdict(existing, keys, tables, rows):
    """CUDA tables check assigned rows before the run (validate=True), with
    the table_check_rows op on host copies; the CPU kernel checks them inside
    table_run. Both refuse the same calls, in the same words."""
    t = _two_small_tables("cpu")
    for k, tid, row in existing:
        t.insert(i64([k]), i64([tid]), scores=i64([[row]]), assign_rows=True)
    k, tt, r = i64(keys), i64(tables), i64([[x] for x in rows])
    python_verdict = cpp_verdict = None
    try:
        t._check_rows(k, tt, r)
    except ValueError as e:
        python_verdict = str(e)
    before = snapshot(t)
    try:
        t.insert(k, tt, scores=r, assign_rows=True)
    except ValueError as e:
        cpp_verdict = str(e)
        assert_same_snapshot(before, snapshot(t))
    assert python_verdict == cpp_verdict


# ------------------------------------------------- the check on each backend --

ROW_VERDICTS = {
    "reserved": "is reserved",
    "table_id": "table id",
    "range": "is out of range [0,",
    "given": "too: a row holds one key",
    "held": "is held by key",
}


def _mixed_table(seed: int) -> ScoredHashTable:
    """Two NO_EVICTION tables around an evicting one, some keys held."""
    t = ScoredHashTable(
        [64, 32, 64],
        bucket_capacities=16,
        no_eviction=[True, False, True],
        row_capacities=[8, 0, 12],
        validate=False,
    )
    g = torch.Generator().manual_seed(seed)
    for table, rows in ((0, 8), (2, 12)):
        n = int(torch.randint(0, rows, (1,), generator=g))
        keys = torch.randperm(40, generator=g)[:n] + 1
        held = torch.randperm(rows, generator=g)[:n]
        t.insert(keys, torch.full_like(keys, table), scores=held[:, None], assign_rows=True)
    t.insert(torch.arange(1, 20), torch.ones(19, dtype=torch.int64))
    return t


def _row_batch(g: torch.Generator, kind: str):
    """A batch (keys, table ids, score values) most likely to end in verdict
    ``kind`` ("ok": none): keys of [1, 48) so that some are in the table and
    some repeat, rows mostly in range."""
    n = int(torch.randint(1, 24, (1,), generator=g))
    keys = torch.randint(1, 48, (n,), generator=g)
    tids = torch.randint(0, 3, (n,), generator=g)
    rows = torch.randint(0, 8, (n,), generator=g)
    i = int(torch.randint(0, n, (1,), generator=g))
    if kind == "reserved":
        keys[i] = -(2**63) + int(torch.randint(0, 4, (1,), generator=g))
    elif kind == "table_id":
        tids[i] = 3 if i % 2 else -1
    elif kind == "range":
        tids[i], rows[i] = 0, 8 + i % 3
    elif kind == "ok":
        # Distinct new keys on distinct rows above any held one.
        keys = torch.arange(100, 100 + n)
        tids = torch.full((n,), 2) if n <= 4 else torch.ones(n, dtype=torch.int64)
        rows = torch.arange(8, 8 + n) if n <= 4 else rows
    values = rows[:, None] if n % 3 else rows[:1, None]  # one row for all, now and then
    return keys, tids, values


def _check_rows_verdict(t: ScoredHashTable, keys, tids, values, device: str):
    state = (t.keys, t.digests, t.scores, t.info, t.free_rows)
    moved = [x.to(device) for x in (keys, tids, *state, values)]
    try:
        OPS.table_check_rows(*moved)
    except ValueError as e:
        return str(e)
    return None


def _row_check_cases():
    g = torch.Generator().manual_seed(11)
    kinds = ["ok", "reserved", "table_id", "range", "random", "random", "random"]
    for case in range(120):
        kind = kinds[case % len(kinds)]
        yield _mixed_table(case), *_row_batch(g, kind)


def test_the_check_op_names_every_kind_of_verdict():
    """The cases below reach every rule of the check (cc/table/row_check.h)
    and batches that pass it, on the CPU kernel."""
    seen = set()
    for t, keys, tids, values in _row_check_cases():
        v = _check_rows_verdict(t, keys, tids, values, "cpu")
        seen.add(next((k for k, m in ROW_VERDICTS.items() if v and m in v), v))
    assert seen == set(ROW_VERDICTS) | {None}


@pytest.mark.gpu
def test_cuda_check_rows_gives_the_cpu_kernels_verdict():
    """The CUDA kernel of table_check_rows refuses the batches the CPU one
    refuses, naming the same entry in the same words, and passes the rest."""
    for t, keys, tids, values in _row_check_cases():
        want = _check_rows_verdict(t, keys, tids, values, "cpu")
        assert _check_rows_verdict(t, keys, tids, values, "cuda") == want


@pytest.mark.gpu
def test_a_checked_cuda_table_refuses_what_the_cpu_table_refuses():
    """ScoredHashTable(validate=True) on CUDA checks assigned rows with the op
    on the device before its run: the same verdict as the CPU table's run,
    and the table unchanged."""
    g = torch.Generator().manual_seed(4)
    for case in range(30):
        cpu, cuda = _two_small_tables("cpu"), _two_small_tables("cuda")
        keys = torch.randint(1, 12, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g)
        tids = torch.randint(0, 2, keys.shape, generator=g)
        rows = torch.randint(0, 5, keys.shape, generator=g)[:, None]
        verdicts = []
        for t in (cpu, cuda):
            d = t.device
            t.insert(i64([1, 2], d), i64([0, 1], d), scores=i64([[case % 4]], d), assign_rows=True)
            before = snapshot(t)
            try:
                t.insert(keys.to(d), tids.to(d), scores=rows.to(d), assign_rows=True)
                verdicts.append(None)
            except ValueError as e:
                verdicts.append(str(e))
                assert_same_snapshot(before, snapshot(t))
        assert verdicts[0] == verdicts[1]
