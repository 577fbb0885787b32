"""Embeddings at a table's ``embedding_dtype``, as rows hold them and as
checkpoint files and deltas carry them: the one codec of the embedding part
of a row (``dynamicemb_config.embedding_row_bytes`` gives its bytes).

For float32, float16 and bfloat16 an embedding is ``dim`` elements of the
dtype. For FP8 (``torch.float8_e4m3fn``, a scaled dtype) it is a row of
bytes, as ``cc/storage/row_space.h`` ("FP8 rows") lays it out: ``dim``
e4m3fn codes, zeros to 4 bytes, then the row's float32 scale, a power of two
``s`` with ``max |value| / s`` in (224, 448] (1 for a row of zeros); value
``d`` is ``code_d * s``, exact in float32. ``encode`` of float32 values
rounds each ``value / s`` to the nearest e4m3fn code (ties to even) and
saturates at 448 (the training kernels round stochastically instead;
``encode`` is what a host write of given values does: a checkpoint of
another dtype loaded, a delta or an external storage's rows written).
"""

import torch

from dynamicemb.dynamicemb_config import SCALED_DTYPES, embedding_row_bytes

__all__ = ["as_values", "columns", "convert", "decode", "encode", "fp8_scale", "is_scaled"]

# The largest e4m3fn magnitude (cc/storage/row_space.h, kFp8Max).
FP8_MAX = 448.0


def is_scaled(dtype: torch.dtype) -> bool:
    """Whether rows of ``dtype`` carry a scale (FP8)."""
    return dtype in SCALED_DTYPES


def columns(dtype: torch.dtype, dim: int) -> tuple[torch.dtype, int]:
    """(element dtype, columns) of the embeddings of ``dim`` at ``dtype`` in
    a file or an exported row: ``(dtype, dim)``, or for FP8 ``(uint8,
    embedding_row_bytes)``."""
    if is_scaled(dtype):
        return torch.uint8, embedding_row_bytes(dim, dtype)
    return dtype, dim


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """float32 power-of-two scales of rows whose largest magnitude is
    ``amax`` (float32): ``amax / s`` in (224, 448]; 1 for zeros or a row not
    finite (cc/storage/row_space.h, fp8_scale)."""
    amax = amax.float()
    m, e = torch.frexp(amax / FP8_MAX)
    e = torch.where(m == 0.5, e - 1, e)
    s = torch.ldexp(torch.ones_like(amax), e)
    ok = (amax > 0) & torch.isfinite(amax)
    return torch.where(ok, s, torch.ones_like(s))


def encode(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, dim) values (float32, or any float dtype) at ``dtype``: (n, dim)
    of it, or for FP8 the (n, embedding_row_bytes) uint8 rows."""
    if not is_scaled(dtype):
        return values.to(dtype)
    v = values.float()
    n, dim = v.shape
    scale = fp8_scale(v.abs().amax(dim=1) if dim else v.new_zeros(n))
    y = (v / scale[:, None]).clamp(-FP8_MAX, FP8_MAX)
    out = torch.zeros(n, embedding_row_bytes(dim, dtype), dtype=torch.uint8, device=v.device)
    out[:, :dim] = y.to(dtype).view(torch.uint8)
    out[:, -4:] = scale[:, None].contiguous().view(torch.uint8)
    return out


def decode(stored: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Embeddings as ``columns`` gives them -> (n, dim) float32 values
    (exact)."""
    if not is_scaled(dtype):
        return stored[:, :dim].float()
    width = embedding_row_bytes(dim, dtype)
    scale = stored[:, width - 4 : width].contiguous().view(torch.float32)
    return stored[:, :dim].contiguous().view(dtype).float() * scale


def as_values(stored: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Embeddings as ``columns`` gives them, as (n, dim) values: unchanged
    at an element dtype, FP8 rows decoded to float32 (exact; a delta's
    values, which are ``dim`` floating-point columns whatever the table's
    dtype)."""
    return decode(stored, dim, dtype) if is_scaled(dtype) else stored


def convert(stored: torch.Tensor, dim: int, src: torch.dtype, dst: torch.dtype) -> torch.Tensor:
    """Embeddings stored at ``src`` as ``columns`` of ``dst`` gives them
    (unchanged when the dtypes agree; else decoded and encoded: round to
    nearest even)."""
    if src == dst:
        return stored
    return encode(decode(stored, dim, src), dst)
