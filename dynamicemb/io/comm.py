"""The collectives a transfer of rows needs, over the sharding's process group.

A world of one (no process group, or a group of one rank) needs none, so a
single process can dump and load without ``torch.distributed``. Failures are
agreed on: ``agree`` raises on every rank when any rank failed, with the
failing rank's message (as the group's ``error`` class on the ranks that did
not fail), so that no rank waits in a collective for one that gave up;
``verdict`` raises the same error on every rank (the first failing rank's
class and message) and otherwise hands every rank the others' facts.

A call that is collective (every rank of the group must make it) first has
the ranks meet (``meet``): each counts itself in the process group's store
and waits, at most ``MEET_TIMEOUT_S`` seconds (the environment variable
``DYNAMICEMB_MEET_TIMEOUT_S``), for the others. The store is not a
collective, so a rank that made the call alone (``DynamicEmbDump`` under
``if rank == 0``) can never be matched with another collective of the
others: it raises an error naming the call and how many ranks came, instead
of waiting forever. After such an error the ranks are out of step and the
job should end.
"""

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.io.files import DataError, ErrorType

# Seconds a rank waits for the others at the start of a collective call.
MEET_TIMEOUT_S = 300.0

# How many collective calls each process group has met for (the store keys
# of a meeting are numbered by it, the same on every rank of a group).
_meetings: dict[int, int] = {}


def meet_timeout_s() -> float:
    """``DYNAMICEMB_MEET_TIMEOUT_S``, or ``MEET_TIMEOUT_S`` when unset.

    Raises:
        ValueError: the variable is not a positive number.
    """
    raw = os.environ.get("DYNAMICEMB_MEET_TIMEOUT_S")
    if raw is None:
        return MEET_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"DYNAMICEMB_MEET_TIMEOUT_S must be a positive number, got {raw!r}")
    return value


class Group:
    """The ranks of a process group (None: the default group, or a world of
    one without ``torch.distributed``); ``error``: what ``agree`` raises on
    the ranks that did not fail themselves."""

    def __init__(self, pg: dist.ProcessGroup | None, error: ErrorType = DataError) -> None:
        self.error = error
        if pg is None and dist.is_available() and dist.is_initialized():
            pg = dist.group.WORLD
        self.pg = pg
        self.rank = dist.get_rank(pg) if pg is not None else 0
        self.world_size = dist.get_world_size(pg) if pg is not None else 1
        self.device = torch.device("cpu")
        if self.world_size > 1 and dist.get_backend(pg) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())

    @classmethod
    def local(cls, error: ErrorType = DataError) -> "Group":
        """A world of one, whatever process group ``torch.distributed``
        holds: what one process reads and writes alone."""
        group = cls.__new__(cls)
        group.error, group.pg, group.rank, group.world_size = error, None, 0, 1
        group.device = torch.device("cpu")
        return group

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def meet(self, call: str) -> None:
        """Waits until every rank of the group has reached ``call`` (see the
        module doc); a no-op in a world of one, or where the process group
        has no store.

        Raises:
            RuntimeError: not every rank reached ``call`` within the timeout;
                the message names the call and how many ranks came.
        """
        if not self.distributed:
            return
        store = _store_of(self.pg)
        if store is None:
            return
        timeout = meet_timeout_s()
        number = _meetings.get(id(self.pg), 0) + 1
        _meetings[id(self.pg)] = number
        key = f"dynamicemb/meet/{number}/{call}"
        if store.add(key, 1) == self.world_size:
            store.set(f"{key}/all", "1")
        try:
            store.wait([f"{key}/all"], datetime.timedelta(seconds=timeout))
        except Exception as e:
            came = store.add(key, 0)
            raise RuntimeError(
                f"{call} is collective: every rank of the process group calls it, and only "
                f"{came} of {self.world_size} ranks did within {timeout:g} s (rank {self.rank} "
                "waited). Call it on every rank (not under `if rank == 0`); "
                "DYNAMICEMB_MEET_TIMEOUT_S sets the wait."
            ) from e

    def barrier(self) -> None:
        if self.distributed:
            t = torch.zeros(1, device=self.device)
            dist.all_reduce(t, group=self.pg)

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.pg, 0), group=self.pg)
        return box[0]

    def all_reduce(self, values: list[int], op: str = "sum") -> list[int]:
        if not self.distributed:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.all_reduce(
            t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=self.pg
        )
        return t.tolist()

    def agree(self, error: BaseException | None) -> None:
        """Raises on every rank if ``error`` is set on any rank."""
        if not self.distributed:
            if error is not None:
                raise error
            return
        (failed,) = self.all_reduce([0 if error is None else 1], op="max")
        if not failed:
            return
        messages = self.all_gather_object(None if error is None else f"{error}")
        if error is not None:
            raise error
        rank = next(r for r, m in enumerate(messages) if m is not None)
        raise self.error(f"rank {rank} failed: {messages[rank]}")

    def verdict(self, error: BaseException | None, facts: Any = None) -> list[Any]:
        """Every rank's ``facts``, by rank, from one all-gather; or, when any
        rank's ``error`` is set, the first failing rank's error raised on
        every rank alike: its class (the group's ``error`` class for one
        that cannot be built from a message) and its message, prefixed by
        the rank."""
        if not self.distributed:
            if error is not None:
                raise error
            return [facts]
        mine = None if error is None else (type(error), f"{error}")
        got = self.all_gather_object((mine, facts))
        for rank, (failed, _) in enumerate(got):
            if failed is not None:
                cls, message = failed
                try:
                    same = cls(f"rank {rank}: {message}")
                except Exception:
                    same = self.error(f"rank {rank}: {message}")
                raise same from error
        return [f for _, f in got]

    def exchange(self, data: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
        """Sends row i of ``data`` ((n, k) uint8, CPU) to rank ``dest[i]``;
        returns the rows this rank received ((m, k) uint8, CPU), grouped by
        sender rank."""
        if not self.distributed:
            return data
        order = torch.argsort(dest, stable=True)
        data = data[order]
        send = torch.bincount(dest, minlength=self.world_size)
        send_d = send.to(self.device)
        recv_d = torch.empty_like(send_d)
        dist.all_to_all_single(recv_d, send_d, group=self.pg)
        recv = recv_d.cpu()
        width = data.shape[1]
        out = torch.empty(int(recv.sum()), width, dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(
            out,
            data.to(self.device),
            output_split_sizes=recv.tolist(),
            input_split_sizes=send.tolist(),
            group=self.pg,
        )
        return out.cpu()


def _store_of(pg: dist.ProcessGroup) -> Any:
    """The store of a process group (its ranks meet there), or None."""
    get = getattr(dist.distributed_c10d, "_get_process_group_store", None)
    try:
        return None if get is None else get(pg)
    except (KeyError, RuntimeError, ValueError):
        return None
