"""Rows made for writing into a row space: the initial rows of new keys, and
staging buffers of given rows (embeddings and optimizer state packed in the
tables' row format)."""

import torch

from dynamicemb.storage import space as sp
from dynamicemb.storage.layout import RowLayout
from dynamicemb.storage.types import RowInit


def write_initial_rows(dst, offsets, keys, tids, init: RowInit, layout: RowLayout) -> None:
    """Writes the initial rows (``init``'s embeddings, the optimizer's
    initial state) of keys at ``offsets`` of the row space ``dst`` (entries
    at -1 skipped)."""
    if init.write_rows(dst, offsets, keys, tids, layout):
        return
    keep = (offsets >= 0).nonzero().squeeze(1)
    offsets, keys, tids = offsets[keep], keys[keep], tids[keep]
    buf = rows_buffer(keys, tids, None, None, None, init, layout)
    sp.copy_rows(
        dst,
        offsets,
        sp.as_space(buf),
        sp.staging_offsets(keys.numel(), layout, keys.device),
        layout.row_bytes_of(tids),
    )


def rows_buffer(
    keys, tids, embeddings, state, index, init: RowInit, layout: RowLayout
) -> torch.Tensor:
    """A staging buffer of the rows of ``keys``: ``embeddings[index]`` (or the
    initializer's when None) and ``state[index]`` (or the optimizer's initial
    state when None)."""
    n = keys.numel()
    buf = sp.staging(n, layout, keys.device)
    if n == 0:
        return buf
    if embeddings is None:
        emb = init.embeddings(keys, tids)
    else:
        emb = embeddings.to(keys.device)
        emb = emb if index is None else emb[index]
    if state is None and any(layout.state_dims):
        st = torch.zeros((n, max(layout.state_dims)), dtype=torch.float32, device=keys.device)
        for _, sdim, _, sel in layout.dim_groups(tids):
            if sdim:
                part = torch.empty((n if sel is None else sel.numel(), sdim), device=keys.device)
                init.init_state(part)
                if sel is None:
                    st[:, :sdim] = part
                else:
                    st[sel, :sdim] = part
    elif state is not None:
        st = state.to(keys.device, torch.float32)
        st = st if index is None else st[index]
    else:
        st = None
    sp.pack_rows(buf, tids, layout, emb, st)
    return buf
