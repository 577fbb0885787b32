"""The value checks of the embedding module's forward and their errors: the
first failed check named, with the first bad entry and its position."""

import torch

from dynamicemb.table import first_valid_key, reserved_key_error


def check_values(indices, offsets, freq, weights) -> None:
    """The value checks of forward's arguments, each a count of bad entries,
    read in one synchronization; raises naming the first bad argument."""
    n = indices.numel()
    steps = offsets[1:] - offsets[:-1]
    checks = {
        "offsets_start": offsets[:1] != 0,
        "offsets_end": offsets[-1:] != n,
        "offsets_step": steps < 0,
        "indices": indices < first_valid_key(),
    }
    if freq is not None:
        f64 = freq.double()
        checks["frequency_counters"] = ~torch.isfinite(f64) | (f64 < 0) | (f64 != f64.round())
    if weights is not None:
        checks["pooling_weights"] = ~torch.isfinite(weights)
    bad = torch.stack([c.sum() for c in checks.values()]).tolist()
    if any(bad):
        raise_bad_input(dict(zip(checks, bad)), checks, indices, offsets, freq, weights)


def raise_bad_input(bad, checks, indices, offsets, freq, weights) -> None:
    """The error of forward's first failed value check, naming the
    argument, the first bad entry and its position."""
    n = indices.numel()
    if bad["offsets_start"] or bad["offsets_end"]:
        raise ValueError(
            f"offsets must run from 0 to the number of indices ({n}), got "
            f"{int(offsets[0])} to {int(offsets[-1])}"
        )
    if bad["offsets_step"]:
        i = int(checks["offsets_step"].nonzero()[0, 0]) + 1
        raise ValueError(
            f"offsets must not decrease, got {int(offsets[i - 1])} then {int(offsets[i])} at "
            f"index {i}"
        )
    if bad["indices"]:
        i = int(checks["indices"].nonzero()[0, 0])
        raise reserved_key_error("indices", int(indices[i]), i)
    if bad.get("frequency_counters"):
        i = int(checks["frequency_counters"].nonzero()[0, 0])
        raise ValueError(
            "frequency_counters must be finite whole numbers >= 0, got "
            f"{freq[i].item()} at index {i}"
        )
    i = int(checks["pooling_weights"].nonzero()[0, 0])
    raise ValueError(f"pooling_weights must be finite, got {weights[i].item()} at index {i}")
