"""Which key values a table takes: every int64 but the reserved ones below
``FIRST_VALID_KEY`` (``kFirstValidKey`` of cc/table/types.h), which mark slot
states. One check and one message for every place a key enters; and one
rule for a key given twice (``first_repeat``)."""

import torch

from dynamicemb.table._native import constants


def first_valid_key() -> int:
    """The smallest key a table takes."""
    return int(constants()["FIRST_VALID_KEY"])


def pad_key() -> int:
    """The key of a batch's padding entries (``PAD_KEY``): the table's
    ``EMPTY_KEY`` (``kEmptyKey`` of cc/table/types.h), a reserved key that no
    batch may contain. The CUDA table kernels treat it as invalid (slot -1,
    nothing stored); the CPU table kernels refuse it (the counter's
    ``counter_admit`` takes it as padding)."""
    return int(constants()["EMPTY_KEY"])


def reserved_key_error(what: str, key: int, index: int) -> ValueError:
    """The error of a reserved key ``key`` at ``index`` of what ``what`` names."""
    return ValueError(
        f"{what}: key {key} at index {index} is reserved (keys below {first_valid_key()} mark "
        "slot states)"
    )


def first_repeat(values: torch.Tensor, groups: torch.Tensor | None = None):
    """The first entry of ``values`` whose value appears again (within its
    group, when ``groups`` gives one per entry): ``(its index, the times its
    value appears)``, or None when no value repeats. Reads the device once."""
    if values.numel() < 2:
        return None
    if groups is None:
        _, inverse, counts = torch.unique(values, return_inverse=True, return_counts=True)
    else:
        pairs = torch.stack([groups.reshape(-1), values.reshape(-1)])
        _, inverse, counts = torch.unique(pairs, dim=1, return_inverse=True, return_counts=True)
    times = counts[inverse]
    repeated = (times > 1).nonzero()
    if repeated.numel() == 0:
        return None
    i = int(repeated[0, 0])
    return i, int(times[i])


def check_keys(keys: torch.Tensor, what: str) -> None:
    """Raises ``reserved_key_error`` for the first reserved key of ``keys``
    (an int64 tensor; reads the device once)."""
    bad = keys < first_valid_key()
    if keys.numel() and bool(bad.any()):
        i = int(bad.nonzero()[0, 0]) if bad.dim() else 0
        raise reserved_key_error(what, int(keys.reshape(-1)[i]), i)
