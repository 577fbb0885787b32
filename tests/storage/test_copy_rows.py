"""The copy_rows op (cc/storage/copy_rows.h): rows of bytes between two row
spaces of two segments each, against slices copied by hand, on every device;
and the op's registration (opcheck). test_gpu_storage.py compares the CUDA
kernel's paths with the CPU one."""

import pytest
import torch

from dynamicemb.storage import space as sp
from dynamicemb.table import ops
from tests.devices import DEVICES


def _case(device):
    """Two source and two destination segments; rows from either segment to
    either, one entry skipped on each side."""
    g = torch.Generator().manual_seed(3)
    src = tuple(
        torch.randint(0, 256, (64,), dtype=torch.uint8, generator=g).to(device) for _ in range(2)
    )
    dst = tuple(
        torch.randint(0, 256, (80,), dtype=torch.uint8, generator=g).to(device) for _ in range(2)
    )
    # Source offsets from 64 and destination offsets from 80 are in the second segment.
    src_off = torch.tensor([0, 68, 12, -1, 100], device=device)
    dst_off = torch.tensor([84, 8, 40, 0, -1], device=device)
    nbytes = torch.tensor([8, 12, 16, 4, 8], device=device)
    return dst, dst_off, src, src_off, nbytes


def _segment(space, offset, size):
    seg = 0 if offset < space[0].numel() else 1
    start = offset - (0 if seg == 0 else space[0].numel())
    return space[seg], slice(start, start + size)


@pytest.mark.parametrize("device", DEVICES)
def test_copy_rows_copies_each_row_between_the_segments(device):
    dst, dst_off, src, src_off, nbytes = _case(device)
    want = [d.cpu().clone() for d in dst]
    cpu_src = tuple(s.cpu() for s in src)
    for d, s, n in zip(dst_off.tolist(), src_off.tolist(), nbytes.tolist()):
        if d < 0 or s < 0:
            continue
        seg, at = _segment(cpu_src, s, n)
        out, to = _segment(tuple(want), d, n)
        out[to] = seg[at]
    sp.copy_rows(dst, dst_off, src, src_off, nbytes)
    for got, w in zip(dst, want):
        assert torch.equal(got.cpu(), w)


@pytest.mark.parametrize("device", DEVICES)
def test_copy_rows_opcheck(device):
    """The op's schema (both destination segments written in place), its fake
    kernel against the real one, and tracing."""
    dst, dst_off, src, src_off, nbytes = _case(device)
    torch.library.opcheck(ops().copy_rows.default, (*dst, dst_off, *src, src_off, nbytes))


def _slot_case(device, n=300):
    g = torch.Generator().manual_seed(n)
    slots = torch.randint(-1, 1000, (n,), generator=g)
    status = torch.randint(0, 6, (n,), generator=g).to(torch.int8)
    return slots.to(device), status.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_slot_rows_gives_each_slot_its_row_and_the_new_ones_theirs(device):
    """slot_rows against dense torch arithmetic: a slot's row at slot * stride,
    -1 where not stored; the new rows (status other than found) the same, the
    found ones -1."""
    slots, status = _slot_case(device)
    rows, new = ops().slot_rows(slots, status, 136, 2)
    s, st = slots.cpu(), status.cpu()
    want = torch.where(s >= 0, s * 136, -1)
    assert torch.equal(rows.cpu(), want)
    assert torch.equal(new.cpu(), torch.where(st != 2, want, -1))
    empty = ops().slot_rows(slots[:0], status[:0], 136, 2)
    assert [t.numel() for t in empty] == [0, 0]


def test_slot_rows_refuses_bad_input():
    slots, status = _slot_case("cpu", 4)
    with pytest.raises(ValueError, match="one status per slot, got 3 for 4"):
        ops().slot_rows(slots, status[:3], 8, 0)
    with pytest.raises(ValueError, match="stride must not be negative, got -8"):
        ops().slot_rows(slots, status, -8, 0)
    with pytest.raises(TypeError, match="status must be Char"):
        ops().slot_rows(slots, status.long(), 8, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_slot_rows_opcheck(device):
    """The op's schema, its fake kernel against the real one, and tracing."""
    torch.library.opcheck(
        ops().slot_rows.default,
        (*_slot_case(device), 64, 1),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
