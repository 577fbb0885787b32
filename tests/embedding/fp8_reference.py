"""The FP8 row format's arithmetic the tests share (cc/storage/row_space.h,
"FP8 rows"): written here from its statement, independent of the kernels."""

import torch


def pad4(n: int) -> int:
    """``n`` rounded up to a multiple of 4 (the codes' padding)."""
    return -(-n // 4) * 4


def scale_of(amax: torch.Tensor) -> torch.Tensor:
    """The power of two s with amax / s in (224, 448]; 1 for zeros."""
    m, e = torch.frexp(amax.double() / 448.0)
    e = torch.where(m == 0.5, e - 1, e)
    s = torch.ldexp(torch.ones_like(amax, dtype=torch.float64), e)
    return torch.where(amax > 0, s, torch.ones_like(s)).float()


def fp8_values(rows: torch.Tensor, dim: int) -> torch.Tensor:
    """The float32 values of FP8 rows (uint8, a row: ``dim`` e4m3fn codes,
    zeros to ``pad4(dim)`` bytes, the float32 scale, anything after it):
    code * scale."""
    p = pad4(dim)
    scale = rows[:, p : p + 4].contiguous().view(torch.float32)
    return rows[:, :dim].contiguous().view(torch.float8_e4m3fn).float() * scale
