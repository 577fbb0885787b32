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
