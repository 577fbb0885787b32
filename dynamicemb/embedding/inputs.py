"""The value checks of a batch's keys and weights, one rule for the embedding
module's forward and for a sharded collection's batch check
(dynamicemb.shard.batch_checks): the op ``check_batch``
(cc/routing/batch_check.h) finds the first reserved key and the first weight
that breaks its rule; this module names the rules and words the module's
errors for bad input values (the first failed check, with the first bad
entry and its position)."""

import enum

import torch

from dynamicemb._checks import as_tensor
from dynamicemb.dynamicemb_config import DynamicEmbPoolingMode
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


def check_forward_inputs(module, indices, offsets, frequency_counters, pooling_weights):
    """Checks a ``BatchedDynamicEmbeddingTablesV2`` forward's arguments
    (types, shapes, devices, then, with ``check_values``, values, in one host
    synchronization) and returns them on the module's device: indices and
    offsets as int64, frequency counters as int64, weights as given. Raises
    naming the argument; nothing has changed yet."""
    ints = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
    as_tensor(indices, "indices", dtypes=ints, dim=1)
    as_tensor(offsets, "offsets", dtypes=ints, dim=1)
    num_features = len(module.feature_table_map)
    if offsets.numel() < 1 or (offsets.numel() - 1) % num_features:
        raise ValueError(
            f"offsets has {offsets.numel()} entries, not num_features ({num_features}) * "
            "batch_size + 1"
        )
    n = indices.numel()
    if pooling_weights is not None:
        as_tensor(pooling_weights, "pooling_weights", dim=1)
        if module.pooling_mode != DynamicEmbPoolingMode.SUM:
            raise ValueError(
                f"pooling_weights need pooling mode SUM, got {module.pooling_mode.name}"
            )
        if pooling_weights.dtype != torch.float32:
            raise ValueError(f"pooling_weights must be float32, got {pooling_weights.dtype}")
        if pooling_weights.numel() != n:
            raise ValueError(
                f"pooling_weights has {pooling_weights.numel()} entries for {n} indices"
            )
        if pooling_weights.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                "pooling_weights must not require grad while grad mode is enabled: no "
                "gradient is computed for them"
            )
        if frequency_counters is not None:
            raise ValueError("pass either pooling_weights or frequency_counters, not both")
    if frequency_counters is not None:
        as_tensor(
            frequency_counters,
            "frequency_counters",
            dtypes=ints + (torch.float32, torch.float64, torch.float16, torch.bfloat16),
            dim=1,
        )
        if frequency_counters.numel() != n:
            raise ValueError(
                f"frequency_counters has {frequency_counters.numel()} entries for {n} indices"
            )
    dev = module.device
    indices = indices.to(dev).long().contiguous()
    offsets = offsets.to(dev).long().contiguous()
    weights = None if pooling_weights is None else pooling_weights.to(dev).contiguous()
    freq = None if frequency_counters is None else frequency_counters.to(dev).contiguous()
    if module.check_values:
        check_batch_values(indices, offsets, freq, weights)
    if freq is not None:
        freq = freq.long() if freq.is_floating_point() else freq.to(torch.int64)
    return indices, offsets, freq, weights
