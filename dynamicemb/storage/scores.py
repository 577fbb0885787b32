"""Scores of a batch's keys, and how a key's scores travel between tiers.

A table call takes one score policy per score column and the values they use
(``cc/table/table_common.h``, "Scores"). The columns are in the table's
internal order: the compound (TIMESTAMP, LFU) stores (frequency, timestamp).
A key that moves from a backing table into a cache keeps its scores, updated
by the batch as if it had stayed (``carry_scores``).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dynamicemb.dynamicemb_config import DynamicEmbScoreStrategy
from dynamicemb.table import enums

S = DynamicEmbScoreStrategy


@dataclass(frozen=True)
class BatchScore:
    """What a training batch's scores depend on besides its keys.

    Attributes:
        step (Union[int, torch.Tensor]): the module's forward count (STEP's
            score), or a (1, 1) int64 tensor holding it on the keys' device
            (a CUDA graph of the step reads it at each replay).
        custom (Optional[Union[int, torch.Tensor]]): the score ``set_score``
            gave (CUSTOMIZED): one for the batch, or (n, 1) int64, each key
            its table's.
    """

    step: int | torch.Tensor
    custom: int | torch.Tensor | None = None


def table_score_columns(strategies: Sequence[DynamicEmbScoreStrategy]) -> list[int]:
    """For each score column in the user's tuple order, the table's score
    word holding it: the compound (TIMESTAMP, LFU) is stored as (frequency,
    timestamp) whatever the order the user wrote."""
    strategies = tuple(strategies)
    if len(strategies) == 2:
        return [1, 0] if strategies[0] == S.TIMESTAMP else [0, 1]
    return [0]


def cache_strategies(strategies: tuple) -> tuple:
    """The strategies a device cache ranks its keys by: the table's, except
    that NO_EVICTION (whose score word is a row) caches by STEP."""
    return (S.STEP,) if S.NO_EVICTION in strategies else strategies


def batch_policies(strategies: tuple, score: BatchScore, counts: torch.Tensor):
    """Score policies and values of a batch, in the table's internal column
    order: ``(policies, values)`` for ``ScoredHashTable.insert_and_evict``."""
    P = enums.ScorePolicy
    if len(strategies) == 2:  # (TIMESTAMP, LFU) in either order
        vals = torch.stack([counts, torch.zeros_like(counts)], dim=1)
        return [P.ACCUMULATE, P.TIMER], vals
    s = strategies[0]
    if s == S.TIMESTAMP:
        return [P.TIMER], None
    if s == S.STEP:
        if isinstance(score.step, torch.Tensor):
            return [P.ASSIGN], score.step
        # A tensor: under torch.compile the step is a symbolic int, which the
        # table's int path would specialize.
        return [P.ASSIGN], torch.full((1, 1), score.step, dtype=torch.int64, device=counts.device)
    if s == S.CUSTOMIZED:
        return [P.ASSIGN], score.custom
    if s == S.LFU:
        return [P.ACCUMULATE], counts.reshape(-1, 1)
    return [P.NONE], None  # NO_EVICTION: the score word holds the row


def _value_matrix(values, n: int, num_scores: int, device: torch.device) -> torch.Tensor:
    """The policies' values as an (n, num_scores) int64 tensor."""
    if values is None:
        return torch.zeros((n, num_scores), dtype=torch.int64, device=device)
    if isinstance(values, torch.Tensor):
        return values.to(device=device, dtype=torch.int64).reshape(-1, num_scores).expand(n, -1)
    return torch.full((n, num_scores), int(values), dtype=torch.int64, device=device)


def initial_scores(
    policies: Sequence[int], values, n: int, timer: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """(n, num_scores) int64: the scores n keys get when this batch inserts
    them into a table (the table's ``initial_score``); ``timer`` is a (1)
    reading of the clock TIMER uses."""
    P = enums.ScorePolicy
    ns = len(policies)
    vals = _value_matrix(values, n, ns, device)
    out = torch.zeros((n, ns), dtype=torch.int64, device=device)
    for c, p in enumerate(policies):
        if p in (P.ASSIGN, P.ACCUMULATE):
            out[:, c] = vals[:, c]
        elif p == P.TIMER:
            out[:, c] = timer.to(device)
    return out


def carry_scores(
    policies: Sequence[int], values, prior: torch.Tensor, fresh: torch.Tensor
) -> torch.Tensor:
    """(n, num_scores): the scores of keys that enter a table with earlier
    scores ``prior`` (from the tier they come from), as if they had been in
    it when this batch found them: ACCUMULATE adds the batch's value to
    ``prior``, NONE keeps ``prior``, ASSIGN and TIMER take ``fresh`` (what the
    batch gave them on entering)."""
    P = enums.ScorePolicy
    n, ns = prior.shape
    vals = _value_matrix(values, n, ns, prior.device)
    out = fresh.clone()
    for c, p in enumerate(policies):
        if p == P.ACCUMULATE:
            out[:, c] = prior[:, c] + vals[:, c]
        elif p == P.NONE:
            out[:, c] = prior[:, c]
    return out
