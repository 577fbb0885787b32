"""How an inference table stores a row: the five formats, each one row of
bytes a lookup reads whole.

===================  ===========================================  ============
format               one row of ``dim`` values                     bytes
===================  ===========================================  ============
``float32``          ``dim`` float32                               4 dim
``float16``          ``dim`` float16                               2 dim
``bfloat16``         ``dim`` bfloat16                              2 dim
``float8_e4m3fn``    ``dim`` e4m3fn of value / scale, padded to    pad4(dim) + 4
                     4 bytes, then the float32 scale
                     (max |value| / 448)
``int8``             ``dim`` uint8 codes, then float32 scale and   dim + 8
                     bias: value = code * scale + bias
===================  ===========================================  ============

``int8`` is FBGEMM's fused 8-bit row-wise layout (``FloatToFused8BitRowwise
Quantized``: the codes, then a float32 scale and bias), the one PyTorch's
``quantized::embedding_bag_byte_rowwise_offsets`` reads, which a lookup uses
where the device has it. FBGEMM's inference TBE keeps the scale and bias in
float16 ahead of the codes (4 bytes less a row); their float32 keeps the
quantization error at half a step (``scale / 2``) for any row, where float16
would add its own rounding of both. Rows are encoded from float64: the
scale of an ``int8`` or ``float8_e4m3fn`` row is rounded up to float32, so
that every value of the row lies within the codes' range.

Quantization errors, per value ``x`` of a row (what the tests check):
``float16`` ``|x| 2**-11`` (``2**-25`` below its smallest normal),
``bfloat16`` ``|x| 2**-8``, ``float8_e4m3fn`` ``max(|x| 2**-4, scale 2**-10)``,
``int8`` ``scale / 2``, each plus float32's rounding of the product.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["FORMATS", "Pool", "RowFormat", "format_of", "pooler"]

# The largest e4m3fn value: a row's scale maps its largest magnitude onto it.
FP8_MAX = 448.0
# Rows encoded at once (bounds the float64 copy an encode makes).
_ENCODE_ROWS = 1 << 16


def _pad4(n: int) -> int:
    return -(-n // 4) * 4


def _scale_up(scale: torch.Tensor) -> torch.Tensor:
    """float64 scales rounded up to float32 (never below the exact value)."""
    f = scale.float()
    low = f.double() < scale
    return torch.where(low, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """(n, k) float32 -> (n, 4 k) uint8, the same bytes."""
    return t.contiguous().view(torch.uint8)


@dataclass(frozen=True)
class RowFormat:
    """One way of storing rows.

    Attributes:
        name (str): the format's name (its dtype's, ``int8`` for row-wise
            INT8).
        dtype (torch.dtype): what selects it (``torch.int8`` for row-wise
            INT8).
        storage (torch.dtype): the element dtype of the stored rows.
        quantized (bool): rows carry a scale (and bias): encoding refuses a
            row that is not finite.
    """

    name: str
    dtype: torch.dtype
    storage: torch.dtype
    quantized: bool
    _width: Callable[[int], int]
    _encode: Callable[[torch.Tensor], torch.Tensor]
    _decode: Callable[[torch.Tensor, int], torch.Tensor]

    def width(self, dim: int) -> int:
        """Elements of ``storage`` per stored row of ``dim`` values."""
        return self._width(dim)

    def row_bytes(self, dim: int) -> int:
        """Bytes of one stored row of ``dim`` values."""
        return self._width(dim) * self.storage.itemsize

    def unstorable(self, rows: torch.Tensor) -> torch.Tensor:
        """(n) bool: the rows this format cannot store (not finite for a
        quantized format; beyond float16's range for float16)."""
        if self.quantized:
            return ~torch.isfinite(rows).all(dim=1)
        if self.storage == torch.float16:
            finite = torch.isfinite(rows).all(dim=1)
            return finite & ~torch.isfinite(rows.to(torch.float16)).all(dim=1)
        return torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, dim) float32 rows -> (n, width) stored rows."""
        if rows.dtype != torch.float32:
            raise TypeError(f"rows to encode must be float32, got {rows.dtype}")
        if rows.shape[0] <= _ENCODE_ROWS:
            return self._encode(rows)
        return torch.cat(
            [
                self._encode(rows[i : i + _ENCODE_ROWS])
                for i in range(0, rows.shape[0], _ENCODE_ROWS)
            ]
        )

    def decode(self, stored: torch.Tensor, dim: int) -> torch.Tensor:
        """(n, width) stored rows -> (n, dim) float32 values."""
        return self._decode(stored, dim)


def _encode_float(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda rows: rows.to(dtype)


def _decode_float(stored: torch.Tensor, dim: int) -> torch.Tensor:
    return stored.float()


def _encode_fp8(rows: torch.Tensor) -> torch.Tensor:
    x = rows.double()
    amax = x.abs().amax(dim=1)
    scale = _scale_up(amax / FP8_MAX)
    scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    y = (x / scale.double()[:, None]).clamp(-FP8_MAX, FP8_MAX).float()
    n, dim = rows.shape
    out = torch.zeros(n, _pad4(dim) + 4, dtype=torch.uint8, device=rows.device)
    out[:, :dim] = y.to(torch.float8_e4m3fn).view(torch.uint8)
    out[:, _pad4(dim) :] = _bytes_of(scale[:, None])
    return out


def _decode_fp8(stored: torch.Tensor, dim: int) -> torch.Tensor:
    p = _pad4(dim)
    values = stored[:, :dim].view(torch.float8_e4m3fn).float()
    return values * stored[:, p : p + 4].view(torch.float32)


def _encode_int8(rows: torch.Tensor) -> torch.Tensor:
    x = rows.double()
    lo, hi = x.amin(dim=1), x.amax(dim=1)
    bias = lo.float()  # exact: the rows are float32
    scale = _scale_up((hi - bias.double()) / 255.0)
    step = scale.double()[:, None]
    codes = torch.where(step > 0, (x - bias.double()[:, None]) / step, torch.zeros_like(x))
    n, dim = rows.shape
    out = torch.empty(n, dim + 8, dtype=torch.uint8, device=rows.device)
    out[:, :dim] = codes.round().clamp(0, 255).to(torch.uint8)
    out[:, dim:] = _bytes_of(torch.stack([scale, bias], dim=1))
    return out


def _decode_int8(stored: torch.Tensor, dim: int) -> torch.Tensor:
    qparams = stored[:, dim : dim + 8].contiguous().view(torch.float32)
    return stored[:, :dim].float() * qparams[:, :1] + qparams[:, 1:]


FORMATS: dict[str, RowFormat] = {
    f.name: f
    for f in (
        RowFormat(
            "float32",
            torch.float32,
            torch.float32,
            False,
            int,
            _encode_float(torch.float32),
            _decode_float,
        ),
        RowFormat(
            "float16",
            torch.float16,
            torch.float16,
            False,
            int,
            _encode_float(torch.float16),
            _decode_float,
        ),
        RowFormat(
            "bfloat16",
            torch.bfloat16,
            torch.bfloat16,
            False,
            int,
            _encode_float(torch.bfloat16),
            _decode_float,
        ),
        RowFormat(
            "float8_e4m3fn",
            torch.float8_e4m3fn,
            torch.uint8,
            True,
            lambda d: _pad4(d) + 4,
            _encode_fp8,
            _decode_fp8,
        ),
        RowFormat(
            "int8", torch.int8, torch.uint8, True, lambda d: d + 8, _encode_int8, _decode_int8
        ),
    )
}


def format_of(dtype: torch.dtype | str) -> RowFormat:
    """The format a dtype (or its name) selects.

    Raises:
        ValueError: a dtype no format stores, naming the ones that exist.
    """
    for f in FORMATS.values():
        if dtype == f.dtype or dtype == f.name:
            return f
    raise ValueError(
        f"unknown row dtype {dtype!r}: an inference table stores rows as "
        f"{', '.join(FORMATS)} (torch.int8: row-wise INT8 with a float32 scale and bias per row)"
    )


# A pooled lookup's rows: pool(storage, slots, offsets, weights, dim) -> (bags, dim) float32,
# bag b the weighted sum of the stored rows slots[offsets[b]:offsets[b + 1]].
Pool = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", int], torch.Tensor
]

# The formats the extension's embedding_pool reads as stored (its
# ElementType's name): their rows are the training tables' embeddings.
_NATIVE_TYPES = {"float16": "FLOAT16", "bfloat16": "BFLOAT16", "float8_e4m3fn": "FLOAT8_E4M3FN"}


def _pool_float32(storage, slots, offsets, weights, dim):
    return F.embedding_bag(
        slots, storage, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True
    )


def _pool_fused_int8(storage, slots, offsets, weights, dim):
    return torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
        storage, slots, offsets, False, 0, False, weights, None, True
    )


def _pool_decoded(fmt: RowFormat) -> Pool:
    """Gathers the rows, decodes them into float32 and pools the copy."""

    def pool(storage, slots, offsets, weights, dim):
        rows = fmt.decode(storage.index_select(0, slots), dim)
        ids = torch.arange(rows.shape[0], dtype=slots.dtype, device=slots.device)
        return F.embedding_bag(
            ids, rows, offsets, mode="sum", per_sample_weights=weights, include_last_offset=True
        )

    return pool


def _pool_native(fmt: RowFormat) -> Pool:
    """The extension's ``embedding_pool``: each bag's rows read as stored
    (two bytes an element, or an FP8 row's codes and scale) and summed in
    float32 in one pass, as the training tables' lookups pool."""
    from dynamicemb.table import constants, ops

    element_type = int(constants()["ElementType"][_NATIVE_TYPES[fmt.name]])
    embedding_pool = ops().embedding_pool

    def pool(storage, slots, offsets, weights, dim):
        row_bytes = fmt.row_bytes(dim)
        bags = offsets.shape[0] - 1
        # One feature of `bags` samples, its dim the whole output (tiled).
        cols = torch.zeros(1, dtype=torch.int64, device=slots.device)
        dims = torch.full((1,), dim, dtype=torch.int64, device=slots.device)
        occurrences = torch.arange(slots.shape[0], dtype=torch.int64, device=slots.device)
        return embedding_pool(
            storage,
            storage.new_empty(0),
            slots * row_bytes,
            occurrences,
            offsets,
            weights,
            cols,
            dims,
            bags,
            dim,
            element_type,
            None,
            True,
        )

    return pool


def pooler(fmt: RowFormat, device: torch.device, native: bool = True) -> Pool:
    """How a pooled lookup of ``fmt``'s rows runs on ``device``, chosen once:
    ``F.embedding_bag`` over float32 rows; PyTorch's fused ``int8`` lookup
    where the device has it; with ``native``, the extension's one pass over
    the stored rows for float16, bfloat16 and FP8 where it has a kernel for
    the device; else the rows gathered, decoded and pooled (PyTorch's ops
    alone: what an exported lookup runs)."""
    if fmt.storage == torch.float32:
        return _pool_float32
    if fmt.name == "int8" and has_fused_int8(device):
        return _pool_fused_int8
    if native and fmt.name in _NATIVE_TYPES and has_native_pool(device):
        return _pool_native(fmt)
    return _pool_decoded(fmt)


def has_native_pool(device: torch.device) -> bool:
    """Whether the extension's ``embedding_pool`` has a kernel for
    ``device``'s type (its CUDA kernels are built only with CUDA)."""
    from dynamicemb.table import ops

    ops()  # loads the extension, which registers its kernels
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        "dynamicemb::embedding_pool", device.type.upper()
    )


def has_fused_int8(device: torch.device) -> bool:
    """Whether PyTorch has its fused ``int8`` lookup on ``device``'s type."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        "quantized::embedding_bag_byte_rowwise_offsets", device.type.upper()
    )
