"""segmented_unique against a dictionary over (table, key) pairs."""

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamicemb.embedding import segmented_unique
from tests.devices import DEVICES


def reference(keys, tables):
    """The pairs table by table, within a table in the order of their first
    occurrences, and their counts."""
    count = collections.Counter(zip(tables, keys))  # insertion order: first occurrences
    order = sorted(count, key=lambda pair: pair[0])  # stable: by table only
    return order, count


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.integers(-(2**63) + 4, 2**63 - 1) | st.integers(-5, 5), st.integers(0, 3)),
        max_size=60,
    )
)
def test_segmented_unique_matches_a_dictionary(pairs):
    keys = torch.tensor([k for k, _ in pairs], dtype=torch.int64)
    tables = torch.tensor([t for _, t in pairs], dtype=torch.int64)
    su = segmented_unique(keys, tables, 4)
    order, count = reference([k for k, _ in pairs], [t for _, t in pairs])
    assert list(zip(su.table_ids.tolist(), su.keys.tolist())) == order
    assert su.counts.tolist() == [count[p] for p in order]
    assert torch.equal(su.keys[su.inverse], keys)
    assert torch.equal(su.table_ids[su.inverse], tables)
    want = [sum(1 for t, _ in order if t < b) for b in range(5)]
    assert su.table_offsets.tolist() == want
    occ = [0]
    for c in su.counts.tolist():
        occ.append(occ[-1] + c)
    assert su.occ_offsets.tolist() == occ
    for u in range(su.keys.numel()):  # key u's positions in the input
        at = su.order[su.occ_offsets[u] : su.occ_offsets[u + 1]]
        assert (keys[at] == su.keys[u]).all() and (tables[at] == su.table_ids[u]).all()
        assert at.tolist() == sorted(at.tolist())  # in input order


@pytest.mark.parametrize("device", DEVICES)
def test_segmented_unique_on_each_device(device):
    keys = torch.tensor([5, 3, 5, 9, 3, 5], device=device)
    tables = torch.tensor([1, 0, 1, 1, 1, 0], device=device)
    su = segmented_unique(keys, tables, 3)
    assert su.keys.cpu().tolist() == [3, 5, 5, 9, 3]
    assert su.table_ids.cpu().tolist() == [0, 0, 1, 1, 1]
    assert su.counts.cpu().tolist() == [1, 1, 2, 1, 1]
    assert su.table_offsets.cpu().tolist() == [0, 2, 5, 5]
    assert su.inverse.cpu().tolist() == [2, 0, 2, 3, 4, 1]
    assert su.order.cpu().tolist() == [1, 5, 0, 2, 3, 4]
    assert su.occ_offsets.cpu().tolist() == [0, 1, 2, 4, 5, 6]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n, distinct, num_tables",
    [
        (1, 1, 1),
        (3, 2, 8),
        (200, 50, 1000),
        (5000, 300, 3),
        (300_000, 200_000, 10),
        (70_000, 2**62, 40_000),
    ],
)
def test_segmented_unique_cuda_matches_the_cpu(n, distinct, num_tables):
    """The CUDA kernel (a hash set, one radix sort) gives the CPU kernel's
    results, padding included: few and many distinct pairs, more tables than
    keys (the offsets of the tables after the last key's), keys over the whole
    int64 range."""
    g = torch.Generator().manual_seed(n)
    keys = torch.randint(0, distinct, (n,), generator=g) - distinct // 2
    tables = torch.randint(0, num_tables, (n,), generator=g)
    want = segmented_unique(keys, tables, num_tables, padded=True)
    got = segmented_unique(keys.cuda(), tables.cuda(), num_tables, padded=True)
    for name in want.__dataclass_fields__:
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), name


def test_segmented_unique_bad_input():
    with pytest.raises(TypeError, match="int32"):
        segmented_unique(torch.tensor([1], dtype=torch.int32), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match=r"\(2,\) and \(1,\)"):
        segmented_unique(torch.tensor([1, 2]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="num_tables must be positive, got 0"):
        segmented_unique(torch.tensor([1]), torch.tensor([0]), 0)


def test_a_table_id_out_of_range_is_refused_on_the_cpu_naming_it():
    with pytest.raises(ValueError, match=r"table id 5 at index 1 is out of range \[0, 2\)"):
        segmented_unique(torch.tensor([1, 2]), torch.tensor([0, 5]), 2)


@pytest.mark.gpu
def test_debug_mode_catches_a_table_id_out_of_range_on_cuda(monkeypatch):
    """On CUDA the ids are not read on the host; DYNAMICEMB_DEBUG checks the
    table offsets instead."""
    monkeypatch.setenv("DYNAMICEMB_DEBUG", "1")
    segmented_unique(torch.tensor([1, 2]).cuda(), torch.tensor([0, 1]).cuda(), 2)
    with pytest.raises(RuntimeError, match=r"table_offsets\[2\] is 1, not the 2 distinct keys"):
        segmented_unique(torch.tensor([1, 2]).cuda(), torch.tensor([0, 5]).cuda(), 2)


@pytest.mark.parametrize("device", DEVICES)
def test_segmented_unique_opcheck(device):
    """The op's schema, its fake kernel against the real one, and tracing."""
    from dynamicemb.embedding.unique import PAD_KEY
    from dynamicemb.table import ops

    keys = torch.tensor([5, 3, 5, 9, 3, 5, 2**40], device=device)
    tables = torch.tensor([1, 0, 1, 1, 1, 0, 2], device=device)
    torch.library.opcheck(
        ops().segmented_unique.default,
        (keys, tables, 3, PAD_KEY),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


def test_pad_key_is_the_empty_key_and_reserved():
    """The key that pads batches is one value for unique, the storage and the table, the
    table's empty key, and a reserved key a caller's batch may not hold."""
    from dynamicemb.embedding.unique import PAD_KEY as unique_pad
    from dynamicemb.storage.space import PAD_KEY as storage_pad
    from dynamicemb.table import PAD_KEY, check_keys
    from tests.table import table_model as M

    assert PAD_KEY == unique_pad == storage_pad == M.EMPTY_KEY
    with pytest.raises(ValueError, match=rf"key {PAD_KEY} at index 1"):
        check_keys(torch.tensor([5, PAD_KEY], dtype=torch.int64), "keys")
