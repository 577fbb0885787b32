"""Custom eviction scores: a user's ``score_function`` evaluated over the
buckets a batch may evict from.

The compound (TIMESTAMP, LFU) strategy keeps two score words per key; the
table stores them as (frequency, timestamp) whatever the tuple order. With a
``score_function``, before each insert_and_evict the module evaluates

    score_function(scores, cur_timestamp) -> float64

for every slot of the home buckets of the batch's keys, ``scores`` being the
slot's two words in the user's tuple order and ``cur_timestamp`` one reading
of the clock the TIMESTAMP words come from. The table ranks the victims of a
full bucket by these values first (the victim order, and why evaluating them
before the call is exact: cc/table/scores.h, "Scores").

The function is compiled with numba: ``numba.njit`` for tables on the CPU,
``numba.cuda.jit(device=True)`` for tables on a GPU, where one block
evaluates one bucket. ``scores`` is a 2-tuple of int64, indexed with
constants.
"""

from collections.abc import Callable, Sequence

import torch

from dynamicemb.dynamicemb_config import DynamicEmbScoreStrategy
from dynamicemb.storage.scores import table_score_columns
from dynamicemb.table import ScoredHashTable, enums

__all__ = ["VictimScorer", "evaluate_scores", "table_score_columns"]

S = DynamicEmbScoreStrategy

# Threads per bucket in the CUDA kernel.
_CUDA_BLOCK = 128


def evaluate_scores(fn: Callable, scores: torch.Tensor, cur_timestamp: int) -> torch.Tensor:
    """``fn(scores[i], cur_timestamp)`` for every row of ``scores`` ((n, 2)
    int64 CPU tensor in the user's tuple order), as float64, compiled with
    numba.njit."""
    import numba
    import numpy as np

    f = numba.njit(_python_function(fn))

    @numba.njit
    def evaluate(s, cur, out):
        for i in range(s.shape[0]):
            out[i] = f((s[i, 0], s[i, 1]), cur)

    out = np.empty(scores.shape[0], dtype=np.float64)
    evaluate(scores.contiguous().numpy(), np.int64(cur_timestamp), out)
    return torch.from_numpy(out)


def _python_function(fn: Callable) -> Callable:
    """The plain Python function of ``fn`` (a numba dispatcher gives its own)."""
    return getattr(fn, "py_func", fn)


def _slot_scorer(f: Callable, timestamp_first: bool) -> Callable:
    """score(scores, slot, cur): the user's function over one slot's two score
    words, handed over in the configured tuple order (table columns: 0
    frequency, 1 timestamp). Compiled for the CPU and for the GPU alike."""

    def score(scores, slot, cur):
        if timestamp_first:
            return f((scores[slot, 1], scores[slot, 0]), cur)
        return f((scores[slot, 0], scores[slot, 1]), cur)

    return score


def _cpu_kernel(fn: Callable, timestamp_first: bool):
    import numba

    score = numba.njit(_slot_scorer(numba.njit(_python_function(fn)), timestamp_first))

    @numba.njit
    def evaluate(scores, starts, widths, now, out):
        cur = now[0]
        for b in range(starts.shape[0]):
            s0 = starts[b]
            if s0 < 0:
                continue
            for j in range(widths[b]):
                out[s0 + j] = score(scores, s0 + j, cur)

    return evaluate


# numba.cuda, imported by the first GPU scorer. The kernel reads it as a
# module global (numba resolves globals when it compiles; its CUDA simulator
# swaps exactly such globals).
cuda = None


def _cuda_kernel(fn: Callable, timestamp_first: bool):
    global cuda
    from numba import cuda as numba_cuda

    cuda = numba_cuda
    f = cuda.jit(device=True)(_python_function(fn))
    score = cuda.jit(device=True)(_slot_scorer(f, timestamp_first))

    def evaluate(scores, starts, widths, now, out):
        s0 = starts[cuda.blockIdx.x]
        if s0 < 0:
            return
        cur = now[0]
        for j in range(cuda.threadIdx.x, widths[cuda.blockIdx.x], cuda.blockDim.x):
            out[s0 + j] = score(scores, s0 + j, cur)

    # Some numba-cuda releases still refer to numpy.row_stack, which NumPy 2.4
    # removed; it was always an alias of vstack, so restore the alias for them.
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    # Compiled now, with the argument types, so that a function numba cannot
    # compile is refused when the module is built.
    return cuda.jit("void(int64[:, :], int64[:], int64[:], int64[:], float64[:])")(evaluate)


class VictimScorer:
    """Evaluates a compound table's ``score_function`` into per-slot victim
    scores for ``ScoredHashTable.insert_and_evict``.

    Args:
        fn (Callable): ``score_function(scores, cur_timestamp) -> float64``.
        strategies (Sequence[DynamicEmbScoreStrategy]): the table's tuple,
            (TIMESTAMP, LFU) or (LFU, TIMESTAMP): the order of ``scores``.
        device (torch.device): where the table lives.

    Raises:
        ValueError: the strategy is not the compound one, or numba cannot
            compile ``fn``.
        ImportError: numba (numba-cuda for a GPU table) is not installed.
    """

    def __init__(
        self, fn: Callable, strategies: Sequence[DynamicEmbScoreStrategy], device: torch.device
    ) -> None:
        strategies = tuple(strategies)
        if len(strategies) != 2 or set(strategies) != {S.TIMESTAMP, S.LFU}:
            raise ValueError(
                "score_function is supported only with the compound score_strategy "
                f"(TIMESTAMP, LFU) in either order, got score_strategy={strategies!r}"
            )
        self.fn = fn
        self.device = torch.device(device)
        self.timestamp_first = strategies[0] == S.TIMESTAMP
        name = getattr(fn, "__name__", repr(fn))
        try:
            if self.device.type == "cuda":
                self._kernel = _cuda_kernel(fn, self.timestamp_first)
            else:
                self._kernel = _cpu_kernel(fn, self.timestamp_first)
                # Compile now (an empty call types the whole kernel).
                empty = torch.empty(0, dtype=torch.int64)
                self._kernel(
                    torch.zeros((1, 2), dtype=torch.int64).numpy(),
                    empty.numpy(),
                    empty.numpy(),
                    torch.zeros(1, dtype=torch.int64).numpy(),
                    torch.empty(0, dtype=torch.float64).numpy(),
                )
        except ImportError:
            raise
        except Exception as e:  # numba's typing and lowering errors
            raise ValueError(
                f"score_function {name} cannot be compiled with numba: {type(e).__name__}: {e}"
            ) from e
        self._out: torch.Tensor | None = None

    def __call__(
        self, table: ScoredHashTable, keys: torch.Tensor, table_ids: torch.Tensor
    ) -> torch.Tensor:
        """(num_slots) float64 victim scores, evaluated over the home buckets
        of ``keys`` (other entries are left as they are: never read)."""
        if (
            self._out is None
            or self._out.numel() != table.num_slots
            or self._out.device != table.device
        ):
            self._out = torch.empty(table.num_slots, dtype=torch.float64, device=table.device)
        starts = table.home_starts(keys, table_ids)
        widths = table.info[table_ids, enums.InfoCol.BUCKET_CAPACITY]
        buckets, inverse = torch.unique(starts, return_inverse=True)
        bucket_widths = torch.zeros_like(buckets).scatter_(0, inverse, widths)
        now = table.timer()
        if buckets.numel():
            self._launch(table.scores, buckets, bucket_widths, now, self._out)
        return self._out

    def _launch(self, scores, starts, widths, now, out) -> None:
        if self.device.type != "cuda":
            self._kernel(scores.numpy(), starts.numpy(), widths.numpy(), now.numpy(), out.numpy())
            return
        stream = cuda.external_stream(torch.cuda.current_stream(out.device).cuda_stream)
        args = [cuda.as_cuda_array(x, sync=False) for x in (scores, starts, widths, now, out)]
        self._kernel[starts.numel(), _CUDA_BLOCK, stream](*args)
