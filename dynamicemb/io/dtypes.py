"""Names of dtypes in the JSON of checkpoints and deltas.

The floating dtypes a file may hold are the tables' embedding dtypes
(``EMBEDDING_DTYPES``, the optimizer state's float32 among them) and
float64 (a delta's values as a caller gave them); integer dtypes (keys,
counts) are named as torch names them (``int64``).
"""

import torch

from dynamicemb.dynamicemb_config import EMBEDDING_DTYPES, OPTIMIZER_STATE_DTYPE
from dynamicemb.io.files import DataError, ErrorType


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_FLOAT_DTYPES = {_name(d): d for d in (*EMBEDDING_DTYPES, OPTIMIZER_STATE_DTYPE, torch.float64)}


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a floating dtype a file may hold (``float16``).

    Raises:
        ValueError: a dtype no file holds.
    """
    if dtype not in _FLOAT_DTYPES.values():
        raise ValueError(
            f"dtype {dtype} cannot be stored in a file (known: {sorted(_FLOAT_DTYPES)})"
        )
    return _name(dtype)


def dtype_of(name: str, what: str, error: ErrorType = DataError) -> torch.dtype:
    """The floating dtype ``dtype_name`` named ``name``."""
    if name not in _FLOAT_DTYPES:
        raise error(f"{what}: unknown dtype {name!r} (known: {sorted(_FLOAT_DTYPES)})")
    return _FLOAT_DTYPES[name]


def key_dtype_name(dtype: torch.dtype) -> str:
    """The name of an integer key dtype (``int64``)."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(f"key dtype {dtype} is not an integer dtype")
    return _name(dtype)


def key_dtype_of(name: str, what: str, error: ErrorType = DataError) -> torch.dtype:
    """The integer dtype ``key_dtype_name`` named ``name``."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or dtype.is_floating_point or dtype.is_complex:
        raise error(f"{what}: unknown key dtype {name!r}")
    return dtype
