"""The value checks of a batch's keys and weights, one rule for the embedding
module's forward and for a sharded collection's batch check
(dynamicemb.shard.batch_checks): the op ``check_batch``
(cc/routing/batch_check.h) finds the first reserved key and the first weight
that breaks its rule; this module names the rules and words the module's
errors for bad input values (the first failed check, with the first bad
entry and its position)."""

import enum

import torch

from dynamicemb.table import ops, reserved_key_error

# What a batch's weights are, the rule each follows, and that rule's code in
# check_batch's weight_rule (cc/routing/batch_check.h, WeightRule).
COUNTERS, POOLING = "frequency counters", "pooling weights"
WEIGHT_RULES = {COUNTERS: "finite whole numbers >= 0", POOLING: "finite"}
WEIGHT_RULE_CODES = {None: 0, POOLING: 1, COUNTERS: 2}


class Finding(enum.IntEnum):
    """check_batch's finding codes (cc/routing/batch_check.h, BatchCode), the
    first of which its verdict row (code, a, b, c) reports."""

    OK = 0
    OFFSETS_START = 8  # a: first offset
    NEGATIVE_LENGTH = 9  # a: position, b: length
    LENGTHS_SUM = 10  # a: sum of the lengths, b: values
    RESERVED_KEY = 11  # a: position in the values, b: key, c: feature
    BAD_WEIGHT = 12  # a: position, b: the weight's float64 bits, c: feature


def check_batch_values(indices, offsets, freq, weights) -> None:
    """The embedding module's value checks of a batch in TBE layout (one
    ``check_batch`` over its bags, the offsets' ends beside it), read in one
    synchronization; raises ``ValueError`` naming the argument, the first bad
    entry and its position."""
    n = indices.numel()
    lengths = offsets[1:] - offsets[:-1]
    kind = COUNTERS if freq is not None else POOLING if weights is not None else None
    verdict = ops().check_batch(
        indices,
        lengths,
        freq.double() if freq is not None else weights,
        None,
        None,
        1,
        max(lengths.numel(), 1),
        WEIGHT_RULE_CODES[kind],
    )
    start, end, code, a, b, _ = torch.cat([offsets[:1], offsets[-1:], verdict[:4]]).tolist()
    if start != 0 or end != n:
        raise ValueError(
            f"offsets must run from 0 to the number of indices ({n}), got {start} to {end}"
        )
    if code == Finding.NEGATIVE_LENGTH:
        i = a + 1
        raise ValueError(
            f"offsets must not decrease, got {int(offsets[i - 1])} then {int(offsets[i])} at "
            f"index {i}"
        )
    if code == Finding.RESERVED_KEY:
        raise reserved_key_error("indices", b, a)
    if code == Finding.BAD_WEIGHT:
        name, bad = (
            ("frequency_counters", freq) if freq is not None else ("pooling_weights", weights)
        )
        raise ValueError(f"{name} must be {WEIGHT_RULES[kind]}, got {bad[a].item()} at index {a}")
