"""The collectives a transfer of rows needs, over the sharding's process group.

A world of one (no process group, or a group of one rank) needs none, so a
single process can dump and load without ``torch.distributed``. Failures are
agreed on: ``agree`` raises on every rank when any rank failed, with the
failing rank's message (as the group's ``error`` class on the ranks that did
not fail), so that no rank waits in a collective for one that gave up.
"""

from typing import Any

import torch
import torch.distributed as dist

from dynamicemb.io.files import DataError, ErrorType


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
