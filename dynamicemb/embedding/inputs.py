"""The errors of the embedding module's forward for bad input values: the
first failed check named, with the first bad entry and its position."""

from dynamicemb.table import reserved_key_error


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
