"""Row spaces: the memory rows live in and the one way rows move.

A row space is two segments addressed by byte offset (offsets below the first
segment's size are in it, the rest in the second): what the pooling kernels
and ``copy_rows`` read and write (``cc/storage/row_space.h``). A segment is a
flat uint8 tensor the kernels can address on the storage's device. A host
segment of a CUDA storage is pinned host memory mapped into the device's
address space (the kernels read and write it directly); on the CPU every
segment is host memory.

A *staging* buffer is a one-segment row space of ``n`` rows of a fixed stride
(the module's widest row), row i at ``i * stride``: how rows travel between a
storage and anything that is not a row space (initializers, an external
``Storage``, checkpoints). ``pack_rows`` and ``unpack_rows`` convert between
staging rows and (embedding, optimizer state) tensors.
"""

from dataclasses import dataclass

import torch

from dynamicemb.io import embeddings as emb
from dynamicemb.storage.layout import RowLayout
from dynamicemb.table import PAD_KEY, extension, ops
from dynamicemb.types import MemoryType


@dataclass
class Segment:
    """A flat uint8 buffer of rows.

    Attributes:
        data (torch.Tensor): (nbytes) uint8, addressable on the storage's
            device (for mapped host memory: its device view).
        memory (MemoryType): where the bytes are.
        host_view (Optional[torch.Tensor]): the CPU view of mapped host memory.
    """

    data: torch.Tensor
    memory: MemoryType
    host_view: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def allocate(nbytes: int, tier: MemoryType, device: torch.device) -> Segment:
    """A segment of ``nbytes`` for the device tier or the host tier of a
    storage on ``device``. Device tier: device memory (zeros). Host tier:
    pinned host memory mapped into the device's address space on CUDA
    (uninitialized), host memory on the CPU (zeros). Out of memory raises."""
    if tier == MemoryType.HOST and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        host, dev = extension().host_mapped_empty(int(nbytes), int(index))
        return Segment(dev, MemoryType.HOST, host)
    memory = MemoryType.HOST if device.type == "cpu" else MemoryType.DEVICE
    return Segment(torch.zeros(int(nbytes), dtype=torch.uint8, device=device), memory)


def empty_segment(device: torch.device) -> Segment:
    return Segment(
        torch.empty(0, dtype=torch.uint8, device=device),
        MemoryType.HOST if device.type == "cpu" else MemoryType.DEVICE,
    )


@dataclass
class RowSpace:
    """Two segments addressed by byte offset."""

    seg0: Segment
    seg1: Segment

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The two segments as the kernels take them."""
        return self.seg0.data, self.seg1.data

    def bytes_in(self, memory: MemoryType) -> int:
        return sum(s.nbytes for s in (self.seg0, self.seg1) if s.memory == memory)


# The sort key of an entry that moves no row: after every offset.
_LAST = torch.iinfo(torch.int64).max
# The sides ``copy_rows`` may put in address order.
SIDES = ("dst", "src")


def address_order(offsets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The permutation that puts the ``valid`` entries in ascending order of
    ``offsets`` (equal offsets in their order) and the others after them, in
    their order: one stable sort on the device, nothing read on the host, the
    shapes the inputs' (a CUDA graph may capture it)."""
    return torch.sort(torch.where(valid, offsets, _LAST), stable=True).indices


def copy_rows(
    dst: tuple[torch.Tensor, torch.Tensor],
    dst_offsets: torch.Tensor,
    src: tuple[torch.Tensor, torch.Tensor],
    src_offsets: torch.Tensor,
    nbytes: torch.Tensor,
    by: str | None = None,
) -> None:
    """For each i with both offsets >= 0: ``nbytes[i]`` bytes from ``src`` at
    ``src_offsets[i]`` to ``dst`` at ``dst_offsets[i]`` (one op, a warp per row
    on the GPU). Rows of the two sides must not overlap.

    ``by`` ("dst" or "src"): the side in host memory, whose rows the copy
    reaches in ascending address order (``address_order``: the entries are
    sorted first), as scattered rows cross the bus about twice as fast in
    address order as in random order (docs/storage.md, "Rows over the
    bus"). The bytes copied are the same either way."""
    if by is not None and by not in SIDES:
        raise ValueError(f"copy_rows: by must be one of {SIDES} or None, got {by!r}")
    if not nbytes.numel():
        return
    if by is not None:
        order = address_order(
            dst_offsets if by == "dst" else src_offsets, (dst_offsets >= 0) & (src_offsets >= 0)
        )
        dst_offsets, src_offsets, nbytes = dst_offsets[order], src_offsets[order], nbytes[order]
    ops().copy_rows(dst[0], dst[1], dst_offsets, src[0], src[1], src_offsets, nbytes)


def scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[index[i]] = src[i]`` for every i with ``index[i] >= 0``, without
    reading anything on the host (one ``copy_rows``): the rows of ``dst`` and
    ``src`` (contiguous, one dtype, rows of a multiple of 4 bytes) are byte
    rows of two row spaces. The indices at or above 0 must be distinct."""
    if index.numel() == 0:
        return
    row = dst[0].numel() * dst.element_size() if dst.dim() > 1 else dst.element_size()
    n = index.numel()
    nbytes = torch.full((n,), row, dtype=torch.int64, device=index.device)
    copy_rows(
        (dst, dst.new_empty(0)),
        torch.where(index >= 0, index * row, -1),
        (src.contiguous(), src.new_empty(0)),
        torch.arange(n, dtype=torch.int64, device=index.device) * row,
        nbytes,
    )


class Subset:
    """The entries of a batch that a mask selects, for the table calls and
    row moves after it.

    Compacted (only the selected entries stay, ``on`` all True) on the CPU,
    where reading costs nothing, and on a GPU when the caller knows how many
    entries the mask selects (``size``: no read of the device either).
    Otherwise, on a GPU, every entry stays, without reading anything on the
    host: ``keys`` puts the table's ``EMPTY_KEY`` (the batches' ``PAD_KEY``,
    which the CUDA table kernels skip: slot -1, status INVALID, nothing
    stored; the CPU kernels refuse it) where the mask is off, ``take`` leaves
    tensors as they are and ``on`` is the mask. Either way a mask computed
    from the subset's table results (a slot >= 0, a status) is off for the
    entries left out.
    """

    def __init__(self, mask: torch.Tensor, size: int | None = None) -> None:
        self.mask = mask
        if mask.device.type == "cpu":
            self.idx = mask.nonzero().squeeze(1)
        elif size is not None:
            self.idx = torch.nonzero_static(mask, size=size).squeeze(1)
        else:
            self.idx = None
        self.on = mask if self.idx is None else torch.ones_like(self.idx, dtype=torch.bool)

    def keys(self, keys: torch.Tensor) -> torch.Tensor:
        if self.idx is not None:
            return keys[self.idx]
        return torch.where(self.mask, keys, PAD_KEY)

    def take(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.idx is None:
            return tensors
        return tuple(t[self.idx] for t in tensors)

    def origin(self, pos: torch.Tensor) -> torch.Tensor:
        """The batch positions of subset positions ``pos``."""
        return pos if self.idx is None else self.idx[pos]


def staging(n: int, layout: RowLayout, device: torch.device) -> torch.Tensor:
    """(n, max_row_bytes) uint8 zeros: n rows of any of the layout's tables."""
    return torch.zeros((n, layout.max_row_bytes), dtype=torch.uint8, device=device)


def staging_offsets(n: int, layout: RowLayout, device: torch.device) -> torch.Tensor:
    """Byte offsets of the n rows of a staging buffer."""
    return torch.arange(n, dtype=torch.int64, device=device) * layout.max_row_bytes


def as_space(buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A staging buffer as a one-segment row space."""
    return buffer.view(-1), buffer.new_empty(0)


def stage_rows(src, offsets: torch.Tensor, tids: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """A staging buffer of the rows of tables ``tids`` at ``offsets`` of the
    row space ``src`` (zeros where an offset is -1)."""
    n = offsets.numel()
    buf = staging(n, layout, offsets.device)
    copy_rows(
        as_space(buf),
        staging_offsets(n, layout, offsets.device),
        src,
        offsets,
        layout.row_bytes_of(tids),
    )
    return buf


def pack_rows(
    buffer: torch.Tensor,
    tids: torch.Tensor,
    layout: RowLayout,
    embeddings: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
) -> None:
    """Writes rows into a staging buffer: for the rows ``index`` (all when
    None) of tables ``tids`` (one per written row), the embedding
    (``embeddings``: (m, >= dim) float32, converted with round to nearest
    even (``dynamicemb.io.embeddings.encode``), or as the layout's dtype
    stores them (``embeddings.columns``: for FP8 the uint8 rows, copied as
    they are)) and the optimizer state (``state``: (m, >= state_dim)
    float32). A part given as None is left as it is."""
    rows = torch.arange(buffer.shape[0], device=buffer.device) if index is None else index
    stored = embeddings is not None and embeddings.dtype == emb.columns(layout.dtype, 1)[0]
    for dim, sdim, soff, sel in layout.dim_groups(tids):
        r = rows if sel is None else rows[sel]
        if embeddings is not None:
            e = embeddings if sel is None else embeddings[sel]
            width = emb.columns(layout.dtype, dim)[1]
            e = e[:, :width] if stored else emb.encode(e[:, :dim], layout.dtype)
            e = e.contiguous().view(torch.uint8).reshape(r.numel(), -1)
            buffer[r, : e.shape[1]] = e
        if state is not None and sdim:
            s = state if sel is None else state[sel]
            s = s[:, :sdim].to(torch.float32).contiguous()
            buffer[r, soff : soff + 4 * sdim] = s.view(torch.uint8).reshape(r.numel(), 4 * sdim)


def unpack_rows(
    buffer: torch.Tensor, tids: torch.Tensor, layout: RowLayout, float_embeddings: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a staging buffer (row i of table ``tids[i]``) as
    ``(embeddings (n, max dim), state (n, max state_dim) float32)``, zeros past
    each table's widths; embeddings in float32 (exact) or, with
    ``float_embeddings=False``, as the layout's dtype stores them
    (``dynamicemb.io.embeddings.columns``: for FP8 (n, max embedding bytes)
    uint8 rows, codes and scale)."""
    n = buffer.shape[0]
    if float_embeddings:
        dtype, width = torch.float32, max(layout.dims)
    else:
        dtype, width = emb.columns(layout.dtype, max(layout.dims))
    out = torch.zeros((n, width), dtype=dtype, device=buffer.device)
    state = torch.zeros((n, max(layout.state_dims)), dtype=torch.float32, device=buffer.device)
    for dim, sdim, soff, sel in layout.dim_groups(tids):
        b = buffer if sel is None else buffer[sel]
        stored_dtype, cols = emb.columns(layout.dtype, dim)
        e = b[:, : cols * stored_dtype.itemsize].contiguous().view(stored_dtype)
        if float_embeddings:
            e, cols = emb.decode(e, dim, layout.dtype), dim
        if sel is None:
            out[:, :cols] = e
        else:
            out[sel, :cols] = e
        if sdim:
            s = b[:, soff : soff + 4 * sdim].contiguous().view(torch.float32)
            if sel is None:
                state[:, :sdim] = s
            else:
                state[sel, :sdim] = s
    return out, state
