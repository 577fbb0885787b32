"""The victim order of cc/table/scores.h ("Scores"), for keys the table does
not hold yet.

A full bucket evicts its smallest (victim score, score words..., position):
victim scores (a ``score_function``'s, when given) with NaN below every
number and -0.0 equal to 0.0, then the score words compared
lexicographically, word 0 first, then the position in the bucket. Where the
layer above must rank keys the table will hold before it holds them (a
checkpoint loaded into a smaller table keeps, per bucket, what eviction
would keep), ``keep_order`` ranks them by the same rule, the other way round;
keys tied in all of it keep the order they are given in (they have no
position yet). tests/table/test_victim_order.py proves it equal to the
table's own order.
"""

import torch

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


def victim_rank_keys(victim_scores: torch.Tensor) -> torch.Tensor:
    """(n) int64 that order as the float64 ``victim_scores`` do in the victim
    order: ascending with the number, NaN first, -0.0 and 0.0 equal
    (``victim_rank_key`` of cc/table/scores.h)."""
    v = victim_scores.to(torch.float64)
    nan = torch.isnan(v)
    bits = (torch.where(nan, 0.0, v) + 0.0).view(torch.int64)  # -0.0 + 0.0 is 0.0
    # Negative doubles order backwards as integers: flip their magnitude bits.
    keys = torch.where(bits >= 0, bits, bits ^ _INT64_MAX)
    return keys.masked_fill(nan, _INT64_MIN)


def keep_order(words: torch.Tensor, victim_scores: torch.Tensor | None = None) -> torch.Tensor:
    """The order in which a bucket's eviction keeps keys, first kept first.

    Args:
        words (torch.Tensor): (n, num_scores) int64 score words, in the
            table's internal column order.
        victim_scores (torch.Tensor, optional): (n) float64, each key's
            victim score (a ``score_function``'s).

    Returns:
        torch.Tensor: (n) int64, a permutation of ``range(n)``.
    """
    order = torch.arange(words.shape[0], device=words.device)
    # A stable sort per column, the last first: lexicographic, word 0 first.
    for c in reversed(range(words.shape[1])):
        order = order[torch.argsort(words[order, c], descending=True, stable=True)]
    if victim_scores is not None:
        ranks = victim_rank_keys(victim_scores.to(words.device))
        order = order[torch.argsort(ranks[order], descending=True, stable=True)]
    return order
