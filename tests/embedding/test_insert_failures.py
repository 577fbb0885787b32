"""Insert failures are counted per table and said by table name: once per
table by default (read from a host copy, never in the step), at a failing
table's 1st, 2nd, 4th, ... failing steps under WARNING, at once under ERROR.

The reference is the hash table's own INSERT_FAILURES counter and the rows a
failed key reads (zeros)."""

import warnings

import pytest
import torch

from dynamicemb import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbTableOptions,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.table import ops
from tests.devices import DEVICES
from tests.embedding.sync_guard import STEP_READS, cuda_syncs_raise, forbid_host_syncs

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType

NAMES = ["user", "item"]


def _module(mode=DynamicEmbCheckMode.IGNORE, device="cpu", names=NAMES, check_values=True):
    # Two tables of one 16-slot bucket each: a batch of more than 16 new keys
    # for a table fails the rest.
    opts = [
        DynamicEmbTableOptions(
            dim=2,
            max_capacity=16,
            bucket_capacity=16,
            safe_check_mode=mode,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.CONSTANT, value=1.0),
        )
        for _ in range(2)
    ]
    m = BatchedDynamicEmbeddingTablesV2(
        opts, [0, 1], Pool.NONE, EmbOptimType.EXACT_SGD, device=device, table_names=names
    )
    m.check_values = check_values
    return m


def _batch(n0, n1, start, device):
    """n0 new keys for table 0 and n1 for table 1, one a bag."""
    b = max(n0, n1)
    keys = torch.cat([torch.arange(start, start + n0), torch.arange(start, start + n1)])
    lengths = torch.tensor([1] * n0 + [0] * (b - n0) + [1] * n1 + [0] * (b - n1))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return keys.to(device), offsets.to(device)


def _step(m, n0, n1, start):
    """A training step of ``_batch`` (pooling NONE: one output row per key);
    returns the rows that read zeros per table."""
    out = m(*_batch(n0, n1, start, m.device))
    out.sum().backward()
    zero = (out.detach().abs().sum(1) == 0).cpu()
    return [int(zero[:n0].sum()), int(zero[n0:].sum())]


def _said(caught):
    return [str(w.message) for w in caught if "could not be inserted" in str(w.message)]


def _hash_table_failures(m):
    return m.rows.hash_table.counter("INSERT_FAILURES").cpu()


@pytest.mark.parametrize("device", DEVICES)
def test_default_counts_per_table_and_says_once_per_table(device):
    m = _module(device=device)
    assert m.table_options[0].safe_check_mode == DynamicEmbCheckMode.IGNORE  # the default
    zeros = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        zeros.append(_step(m, 19, 1, 0))  # "user" fails 3
        zeros.append(_step(m, 20, 1, 100))  # "user" fails 4 (the others evict step 1's)
        zeros.append(_step(m, 1, 18, 200))  # "item" fails 2
        for s in range(3):
            # Nothing fails: the copies of the counters complete.
            zeros.append(_step(m, 1, 1, 5000 + s))
        if device == "cuda":
            torch.cuda.synchronize()
            _step(m, 1, 1, 5000)
            _step(m, 1, 1, 5000)
    assert zeros[:3] == [[3, 0], [4, 0], [0, 2]]
    per_table = m.insert_failures.cpu()
    assert per_table.tolist() == [7, 2]
    assert torch.equal(per_table, _hash_table_failures(m))
    said = _said(caught)
    assert len(said) == 2, said  # once per table, whatever follows
    user = [s for s in said if "'user'" in s]
    item = [s for s in said if "'item'" in s]
    assert len(user) == 1 and len(item) == 1, said
    # The count when it was read (the device may have run ahead of the copy
    # on a GPU), the rows per rank and the option that fixes it.
    assert user[0].startswith(("3 keys", "7 keys")) and "'user'" in user[0]
    for s in said:
        assert "16 rows" in s and "num_embeddings" in s and "max_capacity" in s
    # Asked: the counters, with nothing more to say.
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert m.report_insert_failures() == [7, 2]
    assert _said(again) == []


def test_default_report_reads_nothing_in_the_step():
    m = _module(check_values=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with forbid_host_syncs(allow=STEP_READS):
            _step(m, 19, 1, 0)
    assert len(_said(caught)) == 1


def test_report_on_request_says_what_was_not_said():
    m = _module()
    m._failures.after_step = lambda: None  # no copy: only a request reads
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(m, 19, 17, 0)
        assert _said(caught) == []
        assert m.report_insert_failures() == [3, 1]
        assert m.report_insert_failures() == [3, 1]
    said = _said(caught)
    assert len(said) == 2 and "'user'" in said[0] and "'item'" in said[1], said


def test_warning_names_the_table_at_its_failing_steps_1_2_4_8():
    m = _module(DynamicEmbCheckMode.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(10):
            _step(m, 19, 1, 1000 * s)  # "user" fails 3 every step
    said = _said(caught)
    assert len(said) == 4, said
    assert all(x.startswith("3 keys could not be inserted into dynamic table 'user'") for x in said)
    for total, k, x in zip((3, 6, 12, 24), (1, 2, 4, 8), said):
        assert f"({total} in all, over {k} failing steps" in x, x
    assert m.insert_failures.tolist() == [30, 0]


def test_error_names_the_table_and_the_count():
    m = _module(DynamicEmbCheckMode.ERROR)
    said = "2 keys could not be inserted into dynamic table 'item'"
    with pytest.raises(RuntimeError, match=said):
        _step(m, 3, 18, 0)
    default = _module(DynamicEmbCheckMode.ERROR, names=None)
    with pytest.raises(RuntimeError, match="dynamic table 'table_0'.*num_embeddings"):
        _step(default, 17, 0, 0)


def test_table_names_must_match_the_tables():
    with pytest.raises(ValueError, match="table_names has 1 entries for 2 tables"):
        _module(names=["only"])


@pytest.mark.gpu
def test_cuda_default_report_never_synchronizes():
    m = _module(device="cuda", check_values=False)
    keys, offsets = _batch(19, 1, 0, "cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            with cuda_syncs_raise():
                m(keys, offsets).sum().backward()
            torch.cuda.synchronize()  # the copy completes between the steps
    said = _said(caught)
    assert len(said) == 1 and "'user'" in said[0], said


def _failure_case(device, n=500, num_tables=5):
    g = torch.Generator().manual_seed(n)
    stored = torch.randint(0, 99, (n,), generator=g)
    rows = torch.where(torch.rand(n, generator=g) < 0.3, -1, stored)
    rows[:3] = -2  # REFUSED_ROW-like values: no failure
    tids = torch.randint(0, num_tables, (n,), generator=g)
    valid = torch.rand(n, generator=g) < 0.7
    return rows.to(device), tids.to(device), valid.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("masked", [False, True])
def test_count_failures_adds_each_tables_rows_at_minus_one(device, masked):
    """count_failures against index_add: per table, the rows at -1 (those
    ``valid`` marks), added to what the counters held."""
    rows, tids, valid = _failure_case(device)
    counts = torch.arange(5, dtype=torch.int64, device=device) * 100
    ops().count_failures(counts, rows, tids, valid if masked else None)
    failed = (rows.cpu() == -1) & (valid.cpu() if masked else True)
    want = (torch.arange(5) * 100).index_add_(0, tids.cpu(), failed.long())
    assert torch.equal(counts.cpu(), want)


def test_count_failures_refuses_bad_input():
    rows, tids, valid = _failure_case("cpu", 6)
    counts = torch.zeros(5, dtype=torch.int64)
    with pytest.raises(ValueError, match="one table id .* per row, got 5 table ids for 6 rows"):
        ops().count_failures(counts, rows, tids[:5], None)
    with pytest.raises(ValueError, match="one table id .* per row"):
        ops().count_failures(counts, rows, tids, valid[:5])
    with pytest.raises(TypeError, match="valid must be Bool"):
        ops().count_failures(counts, rows, tids, valid.long())
    assert counts.tolist() == [0] * 5


@pytest.mark.parametrize("device", DEVICES)
def test_count_failures_opcheck(device):
    """The op's schema (the counts written in place), its fake kernel against
    the real one, and tracing."""
    rows, tids, valid = _failure_case(device)
    counts = torch.zeros(5, dtype=torch.int64, device=device)
    torch.library.opcheck(ops().count_failures.default, (counts, rows, tids, valid))
