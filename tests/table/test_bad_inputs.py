"""Caller errors: the right exception type, a message naming the bad value,
and the table exactly as it was (keys, digests, scores, counters, free rows,
info), both through ScoredHashTable and through the raw torch ops.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from dynamicemb.table import ScoredHashTable
from tests.devices import DEVICES
from tests.table import table_model as M
from tests.table.table_testlib import assert_same_snapshot, i64, snapshot

OPS = torch.ops.dynamicemb
RESERVED = [M.EMPTY_KEY, M.EMPTY_KEY + 1, M.EMPTY_KEY + 2, M.EMPTY_KEY + 3]
ASSIGN = M.ASSIGN
# Columns of `info` (cc/table/types.h).
M_INFO = {
    "SLOT_OFFSET": 0,
    "CAPACITY": 1,
    "BUCKET_CAPACITY": 2,
    "BUCKET_OFFSET": 3,
    "ROW_OFFSET": 4,
    "ROW_CAPACITY": 5,
    "MODE": 6,
}


@pytest.fixture(params=DEVICES)
def table(request):
    """Two fused tables, the second NO_EVICTION, with keys, scores, handed-out
    rows and a non-empty free stack."""
    d = request.param
    t = ScoredHashTable(
        [32, 64], bucket_capacities=16, num_scores=2, no_eviction=[False, True], device=d
    )
    t.insert(
        i64(range(40), d),
        i64([k % 2 for k in range(40)], d),
        policies=[ASSIGN, ASSIGN],
        scores=i64([[3, 4]], d),
    )
    t.erase(i64([1, 5, 2], d), i64([1, 1, 0], d))
    return t


INVALID = 4  # InsertStatus.kInvalid (cc/table/types.h)


def expect_refused(table, op, args, exc, match, bad=None):
    """Raw ops: the CPU kernels raise `exc`; the CUDA kernels do not check
    values (that would synchronize) but mark the entries `bad` invalid (their
    valid neighbours are processed), or, when `bad` is None (an inconsistent
    call), every entry, leaving the table as it was."""
    if table.device.type == "cpu":
        expect_error(table, exc, match, lambda: getattr(OPS, op)(*args))
        return
    before = snapshot(table)
    out = getattr(OPS, op)(*args)
    torch.cuda.synchronize()
    if bad is None:  # the whole call is refused: nothing changes
        assert_same_snapshot(before, snapshot(table))
    sel = slice(None) if bad is None else bad
    if op == "table_run":
        assert (out[1][sel].cpu() == INVALID).all(), out[1]
    else:
        slots = out if op == "table_find" else out[0]
        assert (slots[sel].cpu() == -1).all(), slots


def expect_error(table, exc, match, fn):
    before = snapshot(table)
    with pytest.raises(exc, match=match):
        fn()
    assert_same_snapshot(before, snapshot(table))


def run_args(t, **over):
    """Arguments of table_run on the table's own tensors (a call that got
    through would change the table)."""
    d = t.keys.device
    a = dict(
        keys=i64([100, 101, 102], d),
        table_ids=i64([0, 1, 0], d),
        table_keys=t.keys,
        digests=t.digests,
        scores=t.scores,
        info=t.info,
        counters=t.counters,
        free_rows=t.free_rows,
        policies=[ASSIGN, ASSIGN],
        score_values=i64([[1, 2]], d),
        op=M.OP_INSERT_EVICT,
        assign_rows=False,
        total_buckets=t.total_buckets,
        has_rows=True,
    )
    a.update(over)
    return list(a.values())


def find_args(t, **over):
    d = t.keys.device
    a = dict(
        keys=i64([0, 2, 3], d),
        table_ids=i64([0, 0, 1], d),
        table_keys=t.keys,
        digests=t.digests,
        scores=t.scores,
        info=t.info,
        policies=[ASSIGN, ASSIGN],
        score_values=i64([[1, 2]], d),
        update=True,
    )
    a.update(over)
    return list(a.values())


def op_args(t, op, **over):
    """Arguments of the raw op `op` (table_run, table_find, table_find_gather)."""
    if op == "table_run":
        return run_args(t, **over)
    args = find_args(t, **over)
    if op == "table_find_gather":
        args.append(torch.zeros(t.num_slots, 4, device=t.keys.device))
    return args


# ------------------------------------------------------------- wrong dtype --


@pytest.mark.parametrize("method", ["find", "insert", "insert_and_evict", "erase"])
def test_int32_keys_raise_type_error_naming_the_dtype(table, method):
    d = table.device
    keys = torch.tensor([1, 2], dtype=torch.int32, device=d)
    expect_error(table, TypeError, "int32", lambda: getattr(table, method)(keys, i64([0, 0], d)))


def test_int32_table_ids_raise_type_error_naming_the_dtype(table):
    d = table.device
    tids = torch.tensor([0, 1], dtype=torch.int32, device=d)
    expect_error(table, TypeError, "int32", lambda: table.insert(i64([7, 8], d), tids))


@pytest.mark.parametrize("method", ["find", "insert", "insert_and_evict"])
def test_float_scores_raise_type_error_naming_the_dtype(table, method):
    d = table.device
    s = torch.tensor([[1.0, 2.0]], device=d)
    kw = {"update": True} if method == "find" else {}
    expect_error(
        table,
        TypeError,
        "float32",
        lambda: getattr(table, method)(
            i64([7], d), i64([0], d), policies=[ASSIGN, ASSIGN], scores=s, **kw
        ),
    )


def test_raw_run_int32_keys_raise_type_error_naming_the_dtype(table):
    keys = torch.tensor([1, 2, 3], dtype=torch.int32, device=table.device)
    expect_error(table, TypeError, "Int", lambda: OPS.table_run(*run_args(table, keys=keys)))


def test_raw_find_int32_table_ids_raise_type_error_naming_the_dtype(table):
    tids = torch.tensor([0, 0, 1], dtype=torch.int32, device=table.device)
    expect_error(table, TypeError, "Int", lambda: OPS.table_find(*find_args(table, table_ids=tids)))


@pytest.mark.parametrize("op", ["table_run", "table_find", "table_find_gather"])
def test_raw_float_score_values_raise_type_error_naming_the_dtype(table, op):
    vals = torch.tensor([[1.0, 2.0]], device=table.device)
    args = op_args(table, op, score_values=vals)
    expect_error(table, TypeError, "Float", lambda: getattr(OPS, op)(*args))


# ------------------------------------------------------ mismatched lengths --


@pytest.mark.parametrize("method", ["find", "insert", "insert_and_evict", "erase"])
def test_keys_and_table_ids_of_different_lengths_raise_value_error_naming_both(table, method):
    d = table.device
    expect_error(
        table,
        ValueError,
        r"3 vs 2",
        lambda: getattr(table, method)(i64([7, 8, 9], d), i64([0, 1], d)),
    )


@pytest.mark.parametrize("op", ["table_run", "table_find", "table_find_gather"])
def test_raw_keys_and_table_ids_of_different_lengths_raise_value_error(table, op):
    tids = i64([0, 1], table.device)
    args = op_args(table, op, table_ids=tids)
    expect_error(table, ValueError, r"3 vs 2", lambda: getattr(OPS, op)(*args))


def test_score_rows_neither_one_nor_n_raise_value_error_naming_both(table):
    d = table.device
    expect_error(
        table,
        ValueError,
        r"1 or 3 rows, got 2",
        lambda: table.insert_and_evict(
            i64([7, 8, 9], d),
            i64([0, 0, 0], d),
            policies=[ASSIGN, ASSIGN],
            scores=i64([[1, 2], [3, 4]], d),
        ),
    )
    expect_error(
        table,
        ValueError,
        r"1 or 3 rows, got 2",
        lambda: OPS.table_run(*run_args(table, score_values=i64([[1, 2], [3, 4]], d))),
    )


def test_wrong_number_of_score_values_or_policies_raise_value_error(table):
    d = table.device
    expect_error(
        table,
        ValueError,
        r"2 score values, got 3",
        lambda: table.insert(i64([7], d), i64([0], d), scores=[1, 2, 3]),
    )
    expect_error(
        table,
        ValueError,
        r"\(2\), got 1",
        lambda: table.insert(i64([7], d), i64([0], d), policies=[ASSIGN]),
    )
    expect_error(
        table,
        ValueError,
        r"policy 9 of column 1",
        lambda: OPS.table_run(*run_args(table, policies=[ASSIGN, 9])),
    )
    expect_error(table, ValueError, r"got 5", lambda: OPS.table_run(*run_args(table, op=5)))


# ------------------------------------------------------------ bad values --


@pytest.mark.parametrize("key", RESERVED)
@pytest.mark.parametrize("method", ["find", "insert", "insert_and_evict", "erase"])
def test_reserved_key_raises_value_error_naming_key_and_index(table, method, key):
    d = table.device
    keys = i64([7, 8, key, 9], d)
    expect_error(
        table,
        ValueError,
        rf"key {key} at index 2",
        lambda: getattr(table, method)(keys, i64([0, 1, 0, 1], d)),
    )


def test_importing_the_table_package_loads_no_extension_until_pad_key_is_read():
    code = (
        "import sys, dynamicemb.table as t\n"
        "print('dynamicemb._C' in sys.modules)\n"
        "print(t.PAD_KEY, 'dynamicemb._C' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", str(M.EMPTY_KEY), "True"]


@pytest.mark.parametrize("key", RESERVED)
@pytest.mark.parametrize("op", ["table_run", "table_find", "table_find_gather"])
def test_raw_reserved_key_raises_value_error_naming_key_and_index(table, op, key):
    keys = i64([100, key, 101], table.device)
    args = op_args(table, op, keys=keys)
    expect_refused(table, op, args, ValueError, rf"key {key} at index 1", bad=1)


@pytest.mark.parametrize("tid", [2, -1, 2**40])
@pytest.mark.parametrize("method", ["find", "insert", "insert_and_evict", "erase"])
def test_table_id_out_of_range_raises_value_error(table, method, tid):
    d = table.device
    expect_error(
        table,
        ValueError,
        rf"table id {tid} at index 1",
        lambda: getattr(table, method)(i64([7, 8], d), i64([0, tid], d)),
    )


@pytest.mark.parametrize("op", ["table_run", "table_find", "table_find_gather"])
def test_raw_table_id_out_of_range_raises_value_error(table, op):
    tids = i64([0, 1, 2], table.device)
    args = op_args(table, op, table_ids=tids)
    expect_refused(table, op, args, ValueError, r"table id 2 at index 2", bad=2)


def test_assigned_row_out_of_range_raises_value_error(table):
    d = table.device
    expect_error(
        table,
        ValueError,
        r"row 64 at index 1",
        lambda: table.insert(
            i64([300, 301], d), i64([1, 1], d), scores=i64([[3, 0], [64, 0]], d), assign_rows=True
        ),
    )


def test_export_range_or_column_out_of_bounds_raises_value_error(table):
    expect_error(table, ValueError, r"\[0, 97\)", lambda: table.export_batch(0, 97))
    expect_error(table, ValueError, r"\[5, 4\)", lambda: table.export_batch(5, 4))
    expect_error(table, ValueError, r"score column 2", lambda: table.export_batch(score_column=2))


# ---------------------------------------------------------------- layout --


@pytest.mark.parametrize("device", DEVICES)
def test_unaligned_bucket_width_raises_value_error_naming_it(device):
    with pytest.raises(ValueError, match=r"bucket capacity 24 "):
        ScoredHashTable([48], bucket_capacities=24, device=device)
    with pytest.raises(ValueError, match=r"bucket capacity 8 "):
        ScoredHashTable([32, 64], bucket_capacities=[16, 8], device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_capacity_not_a_multiple_of_the_width_raises_value_error_naming_it(device):
    with pytest.raises(ValueError, match=r"capacity 40 "):
        ScoredHashTable([40], bucket_capacities=16, device=device)
    with pytest.raises(ValueError, match=r"capacity 40 "):
        ScoredHashTable([40], bucket_capacities=None, device=device)


def test_relayout_to_unaligned_capacity_raises_value_error_and_changes_nothing(table):
    expect_error(table, ValueError, r"capacity 40 ", lambda: table.relayout([40, 64]))
    expect_error(
        table, ValueError, r"row capacity cannot shrink", lambda: table.relayout([32, 64], [0, 8])
    )


def _bad_info(t, table, col, value):
    info = t.info.clone()
    info[table, col] = value
    return info


@pytest.mark.parametrize(
    "column, value, total_buckets",
    [("BUCKET_CAPACITY", 24, 2), ("CAPACITY", 40, 3)],
    ids=["unaligned_bucket_width", "capacity_not_a_multiple_of_the_width"],
)
@pytest.mark.parametrize("op", ["table_run", "table_find"])
def test_raw_ops_refuse_a_bad_layout_in_info(op, column, value, total_buckets):
    t = ScoredHashTable([48], bucket_capacities=16)
    info = _bad_info(t, 0, M_INFO[column], value)
    common = dict(
        keys=i64([1, 2, 3]),
        table_ids=i64([0, 0, 0]),
        policies=[ASSIGN],
        score_values=i64([[1]]),
        info=info,
    )
    args = (
        run_args(t, has_rows=False, total_buckets=total_buckets, **common)
        if op == "table_run"
        else find_args(t, **common)
    )
    expect_error(t, ValueError, rf"{value}", lambda: getattr(OPS, op)(*args))


@pytest.mark.parametrize("total_buckets", [2, 7, 1000])
def test_raw_run_refuses_a_total_buckets_that_disagrees_with_info(table, total_buckets):
    # 32/16 + 64/16 = 6 buckets
    args = run_args(table, total_buckets=total_buckets)
    expect_refused(table, "table_run", args, ValueError, rf"{total_buckets}")


def test_raw_run_refuses_has_rows_false_with_a_no_eviction_table(table):
    args = run_args(table, has_rows=False)
    expect_refused(table, "table_run", args, ValueError, r"has_rows")


def _run_isolated(body: str) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh interpreter: a call that writes out of bounds
    must not take the test session down with it."""
    code = (
        textwrap.dedent("""
        import torch
        from dynamicemb.table import ScoredHashTable
        OPS = torch.ops.dynamicemb
        t = ScoredHashTable([32, 64], bucket_capacities=16, no_eviction=[False, True])
        t.insert(torch.arange(40), torch.arange(40) % 2)
        before = [x.clone() for x in (t.keys, t.digests, t.scores, t.counters, t.free_rows)]
        def args(**over):
            a = dict(keys=torch.arange(20), table_ids=torch.arange(20) % 2, table_keys=t.keys,
                     digests=t.digests, scores=t.scores, info=t.info, counters=t.counters,
                     free_rows=t.free_rows, policies=[0], score_values=torch.zeros(1, 1, dtype=torch.long),
                     op=2, assign_rows=False, total_buckets=t.total_buckets, has_rows=True)
            a.update(over)
            return list(a.values())
        try:
        """)
        + textwrap.indent(textwrap.dedent(body), "    ")
        + textwrap.dedent("""
        except ValueError as e:
            same = all(torch.equal(a, b) for a, b in zip(before, (t.keys, t.digests, t.scores, t.counters, t.free_rows)))
            print("ValueError", "unchanged" if same else "CHANGED", str(e).splitlines()[0])
        else:
            print("accepted")
        """)
    )
    # The child sees the same modules as this process (torch, dynamicemb).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "what, body, match",
    [
        pytest.param(
            "slot range past the table",
            """
            info = t.info.clone(); info[1, 1] = 1 << 20
            OPS.table_run(*args(info=info, op=0, keys=torch.arange(1000, 3000), table_ids=torch.ones(2000, dtype=torch.long), total_buckets=2 + (1 << 16)))
        """,
            r"info|slot|offset|capacit",
            id="slot_range_past_the_table",
        ),
        pytest.param(
            "slot offsets overlapping",
            """
            info = t.info.clone(); info[1, 0] = 48
            OPS.table_run(*args(info=info, op=0, keys=torch.arange(1000, 1200), table_ids=torch.arange(200) % 2))
        """,
            r"info|slot|offset|capacit",
            id="slot_offsets_overlapping",
        ),
        pytest.param(
            "free_rows shorter than the row capacities",
            """
            OPS.table_run(*args(free_rows=torch.zeros(0, dtype=torch.long)))
        """,
            r"free_rows|row",
            id="free_rows_too_short",
        ),
    ],
)
def test_raw_run_refuses_inconsistent_state_instead_of_writing_out_of_bounds(what, body, match):
    out = _run_isolated(body)
    assert out.returncode == 0, (
        f"{what}: crashed with return code {out.returncode}\n{out.stderr[-2000:]}"
    )
    assert out.stdout.startswith("ValueError unchanged"), (
        f"{what}: {out.stdout!r} {out.stderr[-2000:]}"
    )
    assert re.search(match, out.stdout.split(" ", 2)[2]), out.stdout


# ------------------------------------------------- no silent coercions --


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(capacities=[128.7]), TypeError, r"capacities\[0\] must be an int, got 128.7"),
        (dict(capacities=[128.0]), TypeError, r"capacities\[0\] must be an int, got 128.0"),
        (dict(bucket_capacities=16.5), TypeError, r"bucket_capacities must be an int, got 16.5"),
        (dict(num_scores=1.0), TypeError, r"num_scores must be an int"),
        (dict(no_eviction=1), TypeError, r"no_eviction must be a bool"),
        (dict(max_capacities=100), ValueError, r"max_capacity 100 is not a multiple of the bucket"),
        (dict(max_capacities=129.0), TypeError, r"max_capacities must be an int, got 129.0"),
        (dict(max_load_factor="0.5"), TypeError, r"max_load_factor must be a real number"),
        (dict(max_load_factor=float("nan")), ValueError, r"max_load_factor must be finite"),
        (dict(validate=1), TypeError, r"validate must be a bool"),
        (dict(device="meta"), ValueError, r"meta device"),
    ],
)
def test_constructor_refuses_values_it_would_otherwise_coerce(kwargs, exc, match):
    kw = dict(capacities=[64], bucket_capacities=16)
    kw.update(kwargs)
    with pytest.raises(exc, match=match):
        ScoredHashTable(**kw)


def test_max_capacity_not_reachable_by_doubling_is_refused_at_construction_not_growth():
    # Found: accepted here, failing at the first growth.
    with pytest.raises(ValueError, match=r"table 0: max_capacity 100 is not a multiple of"):
        ScoredHashTable([32], bucket_capacities=16, max_capacities=[100])
    t = ScoredHashTable([32], bucket_capacities=16, max_capacities=[96])
    assert t.reserve([40]) is not None  # doubles to 64, then stops at 96
    assert t.capacity() == 96
    with pytest.raises(
        ValueError, match=r"max_capacity 136 is not a multiple of 16 \(one bucket\)"
    ):
        ScoredHashTable([64], bucket_capacities=None, max_capacities=136)


def test_reserve_refuses_an_entry_per_table_more_or_less(table):
    expect_error(
        table, ValueError, r"incoming has 3 entries for 2 tables", lambda: table.reserve([1, 2, 3])
    )
    expect_error(
        table, ValueError, r"incoming has 1 entries for 2 tables", lambda: table.reserve([1])
    )
    expect_error(
        table, TypeError, r"incoming\[1\] must be an int, got 2.5", lambda: table.reserve([1, 2.5])
    )
    expect_error(
        table, ValueError, r"incoming\[0\] must be at least 0", lambda: table.reserve([-1, 2])
    )


def test_policies_and_score_values_are_not_truncated(table):
    d = table.device
    expect_error(
        table,
        TypeError,
        r"policies\[1\] must be an int, got 1.5",
        lambda: table.insert(i64([7], d), i64([0], d), policies=[ASSIGN, 1.5]),
    )
    expect_error(
        table,
        ValueError,
        r"policies\[0\] is 7, not a score policy",
        lambda: table.insert(i64([7], d), i64([0], d), policies=[7, ASSIGN]),
    )
    expect_error(
        table,
        TypeError,
        r"scores\[0\] must be an int, got 2.7",
        lambda: table.insert(i64([7], d), i64([0], d), scores=[2.7, 1]),
    )
    expect_error(
        table,
        TypeError,
        r"update must be a bool, got 1",
        lambda: table.find(i64([7], d), i64([0], d), update=1),
    )
    expect_error(
        table,
        TypeError,
        r"slot_end must be an int, got 3.0",
        lambda: table.export_batch(0, 3.0),
    )


# ---------------------------------------------------------- wrong devices --


@pytest.mark.parametrize("arg", ["keys", "table_ids", "scores", "victim_scores"])
def test_meta_inputs_are_refused_naming_the_argument(table, arg):
    d = table.device
    kw = dict(
        keys=i64([7, 8], d),
        table_ids=i64([0, 0], d),
        policies=[ASSIGN, ASSIGN],
        scores=i64([[1, 2]], d),
        victim_scores=torch.zeros(table.num_slots, dtype=torch.float64, device=d),
    )
    kw[arg] = kw[arg].to("meta")
    expect_error(
        table, ValueError, rf"{arg} is on the meta device", lambda: table.insert_and_evict(**kw)
    )


def test_find_gather_refuses_values_on_the_meta_device(table):
    # Found: a meta `values` on a CPU table returned slots read from freed memory.
    d = table.device
    vals = torch.zeros(table.num_slots, 4, device="meta")
    expect_error(
        table,
        ValueError,
        r"values is on the meta device",
        lambda: table.find_gather(i64([0, 2], d), vals, i64([0, 0], d)),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("device", DEVICES)
def test_find_gather_refuses_values_on_another_device(device):
    if device == "cpu":
        pytest.skip("needs two devices: a CUDA table and CPU values")
    t = ScoredHashTable([64], bucket_capacities=16, device=device)
    vals = torch.zeros(64, 4)
    with pytest.raises(ValueError, match=r"values must be on cuda:0, got a tensor on cpu"):
        t.find_gather(i64([1], device), vals)
