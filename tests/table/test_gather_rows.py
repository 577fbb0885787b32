"""gather_rows against indexing in plain PyTorch, on CPU and CUDA."""

import pytest
import torch

from dynamicemb.table import gather_rows
from dynamicemb.table._native import ops
from tests.devices import DEVICES


def reference(values, rows):
    out = values[rows.clamp(min=0)].clone()
    out[rows < 0] = 0
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype,dim",
    [
        (torch.float32, 8),
        (torch.float32, 33),
        (torch.float16, 3),
        (torch.bfloat16, 128),
        (torch.float32, 1),
    ],
)
def test_gather_rows_matches_indexing(device, dtype, dim):
    if device == "cuda":
        pytest.importorskip("torch.cuda")
    g = torch.Generator().manual_seed(dim)
    values = torch.randn((50, dim), generator=g).to(dtype).to(device)
    rows = torch.randint(-1, 50, (200,), generator=g).to(device)
    out = gather_rows(values, rows)
    assert out.dtype == dtype and out.shape == (200, dim)
    assert torch.equal(out.cpu(), reference(values.cpu(), rows.cpu()))


def test_gather_rows_empty_batch():
    out = gather_rows(torch.ones((4, 3)), torch.empty(0, dtype=torch.int64))
    assert out.shape == (0, 3)


def test_gather_rows_rejects_row_out_of_range_naming_it():
    with pytest.raises(ValueError, match="row 7 at index 1"):
        gather_rows(torch.ones((4, 3)), torch.tensor([0, 7]))
    with pytest.raises(ValueError, match="row -2 at index 0"):
        gather_rows(torch.ones((4, 3)), torch.tensor([-2]))


def test_gather_rows_rejects_wrong_dtype_and_shape():
    with pytest.raises(TypeError, match="Int"):
        gather_rows(torch.ones((4, 3)), torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        gather_rows(torch.ones(4), torch.tensor([0]))


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rows_opcheck(device):
    values = torch.randn((10, 4), device=device)
    rows = torch.tensor([3, -1, 9, 0], device=device)
    torch.library.opcheck(ops().gather_rows.default, (values, rows))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim,dtype", [(8, torch.float32), (5, torch.float16), (64, torch.float32)])
def test_find_gather_equals_find_then_gather(device, dim, dtype):
    from dynamicemb.table import ScoredHashTable

    table = ScoredHashTable(
        [256, 128],
        bucket_capacities=16,
        no_eviction=[False, True],
        row_capacities=[None, 100],
        device=device,
    )
    g = torch.Generator().manual_seed(dim)
    keys = torch.randint(0, 500, (300,), generator=g)
    tids = torch.randint(0, 2, (300,), generator=g)
    table.insert(keys, tids, scores=1)
    values = torch.randn((256, dim), generator=g).to(dtype).to(device)
    probe = torch.randint(0, 700, (400,), generator=g)
    ptids = torch.randint(0, 2, (400,), generator=g)
    slots, rows = table.find_gather(probe, values, ptids)
    want_slots = table.find(probe, ptids)
    assert torch.equal(slots.cpu(), want_slots.cpu())
    idx = torch.where(ptids.to(device) == 1, table.rows(want_slots), want_slots)
    assert torch.equal(rows.cpu(), reference(values.cpu(), idx.cpu()))
    assert bool((slots >= 0).any()) and bool((slots < 0).any())
