"""Insert failures: counted per table on the device, reported by table name.

A training insert fails when a key's home bucket holds only keys that may not
be evicted (keys of the same batch, or a NO_EVICTION table out of memory); the
key's row is then -1 and it reads zeros. Every failure is counted, per table,
in one (num_tables) int64 tensor on the module's device (``counts``: a tensor
operation queued on the device, no synchronization). What is said about them
follows the tables' ``safe_check_mode``:

* IGNORE (the default): the step reads nothing. After a training step the
  counters are copied to host memory without waiting (pinned memory, an event
  recorded behind the copy); a later step looks at the copy only once the event
  says it is complete (``Event.query`` never waits) and starts the next copy.
  The first time a table's count is not zero, one warning names the table,
  its count and the option that fixes it; nothing more is said about it. On
  the CPU the device is the host: the copy is complete at once.
* WARNING: the step reads its per-table failures (one synchronization a step,
  the mode's price) and warns naming each failing table, at that table's 1st,
  2nd, 4th, 8th, ... failing step (a long run of failures says so a few times,
  not every step), with the step's count and the total.
* ERROR: the same read; a failing step raises RuntimeError naming the tables.

``InsertFailures.report`` reads the counters when someone asks (it
synchronizes) and says what has not been said.
"""

import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dynamicemb.dynamicemb_config import DynamicEmbCheckMode
from dynamicemb.table import ops


def _rank() -> str:
    if dist.is_available() and dist.is_initialized():
        return f" on rank {dist.get_rank()}"
    return ""


class InsertFailures:
    """Per-table insert failure counters of one module and what is said of them.

    Args:
        table_names (Sequence[str]): the module's tables, in its order.
        capacities (Sequence[int]): each table's rows per rank (its
            ``max_capacity``), for the message.
        mode (DynamicEmbCheckMode): the tables' ``safe_check_mode``.
        device (torch.device): the module's device.

    Attributes:
        counts (torch.Tensor): (num_tables) int64 on ``device``: keys that
            could not be inserted, per table, since the module was built.
    """

    def __init__(
        self,
        table_names: Sequence[str],
        capacities: Sequence[int],
        mode: DynamicEmbCheckMode,
        device: torch.device,
    ) -> None:
        self.names = list(table_names)
        self.capacities = [int(c) for c in capacities]
        self.mode = DynamicEmbCheckMode(mode)
        self.counts = torch.zeros(len(self.names), dtype=torch.int64, device=device)
        self._reported: set[int] = set()
        self._failing_steps = [0] * len(self.names)
        pin = device.type == "cuda"
        self._host = torch.zeros(len(self.names), dtype=torch.int64, pin_memory=pin)
        self._event = torch.cuda.Event() if pin else None
        self._copying = False

    def count(
        self, rows: torch.Tensor, table_ids: torch.Tensor, valid: torch.Tensor | None
    ) -> None:
        """Counts a step's failed keys: the entries of ``rows`` (u) int64 at -1
        (an insert failed) that ``valid`` ((u) bool, None: all) marks, by
        ``table_ids`` (u) int64 in range, in one op (``count_failures``);
        WARNING and ERROR read them now (see the module doc)."""
        if self.mode == DynamicEmbCheckMode.IGNORE:
            ops().count_failures(self.counts, rows, table_ids, valid)
            return
        step = torch.zeros_like(self.counts)
        ops().count_failures(step, rows, table_ids, valid)
        self.counts += step
        per_table = step.tolist()  # the mode's one synchronization a step
        failing = [t for t, n in enumerate(per_table) if n]
        if not failing:
            return
        if self.mode == DynamicEmbCheckMode.ERROR:
            raise RuntimeError("; ".join(self._message(t, per_table[t], None) for t in failing))
        totals = self.counts.tolist()
        for t in failing:
            self._reported.add(t)
            self._failing_steps[t] += 1
            k = self._failing_steps[t]
            if k & (k - 1) == 0:  # the table's 1st, 2nd, 4th, ... failing step
                _warn(self._message(t, per_table[t], (totals[t], k)))

    def after_step(self) -> None:
        """IGNORE: says what a completed copy of the counters shows, and starts
        the next copy if none is under way (never waits for the device)."""
        if self.mode != DynamicEmbCheckMode.IGNORE or len(self._reported) == len(self.names):
            return
        if torch.compiler.is_compiling():
            return
        if self._event is not None and torch.cuda.is_current_stream_capturing():
            return
        if self._copying:
            if self._event is not None and not self._event.query():
                return
            self._copying = False
            self._say_new(self._read_copy())
        self._host.copy_(self.counts, non_blocking=self._event is not None)
        self._copying = True
        if self._event is None:  # on the host: the copy is complete
            self._copying = False
            self._say_new(self._read_copy())
        else:
            self._event.record()

    def report(self) -> list[int]:
        """Reads the counters (synchronizes), says what has not been said, and
        returns them per table."""
        totals = self.counts.tolist()
        self._say_new(totals)
        return totals

    def _read_copy(self) -> list[int]:
        """The values of the host copy (complete: see ``after_step``)."""
        return self._host.tolist()

    def _say_new(self, totals: list[int]) -> None:
        for t, n in enumerate(totals):
            if n and t not in self._reported:
                self._reported.add(t)
                _warn(self._message(t, n, None, so_far=True))

    def _message(self, t: int, n: int, repeat, so_far: bool = False) -> str:
        name = self.names[t]
        when = "so far" if so_far else "in this step"
        head = f"{n} keys could not be inserted into dynamic table {name!r}{_rank()} {when}"
        if repeat is not None:
            total, k = repeat
            head += f" ({total} in all, over {k} failing steps; said at failing steps 1, 2, 4, ...)"
        return (
            f"{head}: their embeddings are zeros and they are not trained. Each rank holds "
            f"{self.capacities[t]} rows of it, and a key whose hash bucket is full of keys of "
            "the same batch cannot be placed: give the table more rows (num_embeddings of "
            "its EmbeddingConfig; max_capacity of DynamicEmbTableOptions for a module built "
            "directly), or set safe_check_mode=DynamicEmbCheckMode.ERROR to stop at the first "
            "failure."
        )


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=2)
