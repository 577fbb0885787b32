"""Argument checks shared by the public classes: one rule per kind of value.

Every check raises an error that names the argument and the value it got,
before anything is changed. Numbers are never coerced: a float where an int
is expected (``128.7``, ``16.5``) is refused, not truncated; a bool is not
taken for a number.
"""

import math
import numbers
from typing import Any

import torch


def is_int(value: Any) -> bool:
    """True for an integer (Python or numpy) that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def as_int(value: Any, name: str, *, min: int | None = None) -> int:
    """``value`` as an int, at least ``min``.

    Raises:
        TypeError: not an integer (floats included, even whole ones).
        ValueError: below ``min``.
    """
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if min is not None and value < min:
        raise ValueError(f"{name} must be at least {min}, got {value}")
    return value


def as_real(
    value: Any, name: str, *, finite: bool = True, min: float | None = None, above: bool = False
) -> float:
    """``value`` as a float: a real number, finite unless ``finite`` is False,
    at least ``min`` (strictly above it when ``above``).

    Raises:
        TypeError: not a real number (strings and bools included).
        ValueError: NaN or infinite (when ``finite``), or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    if min is not None and (value <= min if above else value < min):
        raise ValueError(f"{name} must be {'above' if above else 'at least'} {min}, got {value}")
    return value


def device_of(device: Any) -> torch.device:
    """``device`` as torch gives it, with the current CUDA device filled in
    (``"cuda"`` is ``cuda:<current>``), so that devices compare equal."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


def as_tensor(
    value: Any,
    name: str,
    *,
    device: torch.device | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    dim: int | None = None,
) -> torch.Tensor:
    """Checks a tensor argument: a torch.Tensor holding data (not on the meta
    device), on ``device`` when given, of one of ``dtypes``, with ``dim``
    dimensions.

    Raises:
        TypeError: not a tensor, or a dtype not in ``dtypes``.
        ValueError: on the meta device or another device, or the wrong dim.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device: it holds no data to read")
    if device is not None and value.device != device_of(device):
        raise ValueError(f"{name} must be on {device_of(device)}, got a tensor on {value.device}")
    if dtypes is not None and value.dtype not in dtypes:
        want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name} must be {want}, got {str(value.dtype).removeprefix('torch.')}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    return value
