"""Scores at the model level (``get_score``, ``set_score``) and the one rule
for score columns in a delta: user (``score_strategy``) order, a timestamp
as an age against the dumping table's clock, rebased onto the replaying
table's clock."""

import warnings
from typing import Any

import torch

from dynamicemb._checks import is_int
from dynamicemb.dynamicemb_config import DynamicEmbScoreStrategy as S
from dynamicemb.shard.tables import TableRef, model_tables, resolve
from dynamicemb.storage.table_rows import TableRows

__all__ = ["delta_scores", "get_score", "set_score", "table_scores"]


def delta_scores(rows: TableRows, words: torch.Tensor, current: int) -> torch.Tensor:
    """A delta's score columns from a table's internal score words: user
    order, timestamps as ages ``current - timestamp`` (NO_EVICTION: the row,
    verbatim)."""
    if rows.no_eviction:
        return words[:, :1].clone()
    user = words[:, rows.score_columns()].clone()
    for j, s in enumerate(rows.strategies):
        if s == S.TIMESTAMP:
            user[:, j] = current - user[:, j]
    return user


def table_scores(
    rows: TableRows, table: int, user: torch.Tensor, with_scores: bool
) -> torch.Tensor:
    """The internal score words a replay writes for a delta's score columns
    (``delta_scores``' inverse, ages rebased onto this table's clock), or,
    without ``with_scores``, those of keys just inserted here (NO_EVICTION:
    the row, always)."""
    if rows.no_eviction:
        return user[:, :1].to(rows.device)
    n = user.shape[0]
    if not with_scores:
        return rows.fresh_scores(table, n)
    user = user.to(rows.device)
    num_scores = rows.layout_of(table)["num_scores"]
    out = torch.empty(n, num_scores, dtype=torch.int64, device=rows.device)
    now = None
    for j, (s, word) in enumerate(zip(rows.strategies, rows.score_columns())):
        if s == S.TIMESTAMP:
            now = rows.timer() if now is None else now
            out[:, word] = now - user[:, j]
        else:
            out[:, word] = user[:, j]
    return out


def get_score(model: torch.nn.Module) -> dict[str, dict[str, int]] | None:
    """The score each dynamic table gives its keys in the next forward pass:
    the reference point (threshold) of a later ``incremental_dump``.

    Args:
        model (torch.nn.Module): the model holding dynamic tables.

    Returns:
        Dict[str, Dict[str, int]]: collection path -> table name -> score:
        TIMESTAMP (alone or compound): the table device's clock now; STEP:
        the next step; CUSTOMIZED: the score ``set_score`` set (0 before
        any); LFU: 0 (a frequency has no clock); NO_EVICTION: the next fresh
        row; None for a table whose rows live in an external storage (no
        dynamicemb hash table scores them: a dump at this threshold leaves
        the table out). None (with a warning) when the model has no dynamic
        tables.
    """
    tables = model_tables(model)
    if not tables:
        warnings.warn("get_score: the model has no dynamic embedding tables", stacklevel=2)
        return None
    return {
        coll: {
            name: ref.rows.current_score(ref.index) if ref.rows.has_hash_table else None
            for name, ref in refs.items()
        }
        for coll, refs in tables.items()
    }


def _check_score(value: Any, where: str) -> int:
    if not is_int(value):
        raise ValueError(f"set_score: {where} must be an int, got {value!r}")
    return value


def set_score(model: torch.nn.Module, table_score: int | dict[str, dict[str, int]]) -> None:
    """Sets the score the keys of CUSTOMIZED tables get in the next forward
    passes (until set again). Warns when a score is below the table's
    previous one, unless ``DYNAMICEMB_CSTM_SCORE_CHECK=0``.

    Args:
        model (torch.nn.Module): the model holding dynamic tables.
        table_score (Union[int, Dict[str, Dict[str, int]]]): one score for
            every CUSTOMIZED table, or collection (its path, or its name) ->
            table name -> score.

    Raises:
        ValueError: a score that is not an int, an unknown collection or
            table, or a named table whose strategy is not CUSTOMIZED (its
            scores are not the user's to set); nothing is set then.
    """
    tables = model_tables(model)
    if isinstance(table_score, dict):
        chosen = resolve(tables, table_score, "set_score")
        for ref, score in chosen:
            _check_score(score, f"the score of {ref.label}")
            if S.CUSTOMIZED not in ref.rows.strategies:
                raise ValueError(
                    f"set_score: {ref.label} has score_strategy "
                    f"{[s.name for s in ref.rows.strategies]}, not CUSTOMIZED: its scores are "
                    "not set by the user"
                )
    else:
        score = _check_score(table_score, "table_score")
        chosen = [
            (ref, score)
            for refs in tables.values()
            for ref in refs.values()
            if S.CUSTOMIZED in ref.rows.strategies
        ]
        if not chosen:
            warnings.warn("set_score: the model has no CUSTOMIZED dynamic table", stacklevel=2)
    for ref, score in chosen:
        _set(ref, score)


def _set(ref: TableRef, score: int) -> None:
    ref.rows.set_score(ref.index, score)
