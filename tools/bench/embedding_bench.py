"""Train-step time of BatchedDynamicEmbeddingTablesV2 against torch.nn.EmbeddingBag.

    python tools/bench/embedding_bench.py [--device cpu] [--tables 4] [--lookups 16384]
        [--dim 64] [--rows 200000] [--optimizer sgd|adam] [--pooling sum|none]
        [--admission THRESHOLD] [--embedding-dtype DTYPE] [--ops] [--profile]

One step = forward + backward + optimizer update, keys drawn from a power law
(exponent 1.05) over `rows` ids per table, hotness 1. Baselines in the same
run: FBGEMM's SplitTableBatchedEmbeddingBagsCodegen (TorchRec's own static
tables; on the CPU it supports SGD only) and an nn.EmbeddingBag per table
(dense weights of `rows` rows, sparse gradients) with torch.optim.SGD /
SparseAdam. Every version is built first; then they take turns, step by
step, so that a drift of the machine's speed weighs on each alike. Prints the
median of each version's timed steps after warm-up.

The dynamic tables are pre-filled with ``reps + 3`` batches (their hot keys
in the table, as in a job that has run a while); then every step of every
version, warm-up and timed (and those of ``--ops`` and ``--profile``), trains
on a batch no version saw before, a new draw of the same power law (a batch
seen twice finds every key and hides the insert path): each step brings
keys the tables miss. The versions take the same batches in the same order.

``--admission T`` also times, in the same run, the same module with a
``FrequencyAdmissionStrategy(T)`` on every table (a counter share of ``rows``
slots per table) and prints its overhead over the module without: the
module without admission inserts the keys it misses, the one with it counts
them and admits those seen T times.

``--embedding-dtype D`` (float16, bfloat16, float8_e4m3fn) also times, in the
same run, the same module with rows of that dtype (the optimizer state stays
float32) and prints its step time against the float32 module's (``--profile``:
the kernels of each).

``--ops`` prints how many torch ops the host issues in one step of each
module (on a GPU a lookup replayed from a CUDA graph is one).
"""

import argparse
import statistics
import time

import torch

from dynamicemb import (
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynamicemb.dynamicemb_config import EMBEDDING_DTYPES, value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.io.dtypes import dtype_name
from dynamicemb.storage.stats import StatCol


def power_law(g, n, rows, alpha):
    u = torch.rand(n, generator=g, dtype=torch.float64)
    a = 1.0 - alpha
    return (((rows**a - 1.0) * u + 1.0) ** (1.0 / a)).long().clamp(max=rows) - 1


class SeenRows:
    """The distinct rows of each of ``tables`` tables of ``rows`` rows that
    the batches so far hold: how far a stream of new batches has filled a
    cache (a cache of c rows a table is full, and evicts, once its batches
    hold more than c distinct rows in every table)."""

    def __init__(self, tables: int, rows: int, device) -> None:
        self.mask = torch.zeros((tables, rows), dtype=torch.bool, device=device)

    def add(self, ids: torch.Tensor) -> None:
        """A batch's ids, the same number for each table, table after table."""
        self.mask.scatter_(1, ids.view(self.mask.shape[0], -1), True)

    def fewest(self) -> int:
        """The distinct rows of the table with the fewest."""
        return int(self.mask.sum(1).min())

    def warm_up(self, draw, warmup: int, target: int, fill: float):
        """Yields new batches ``draw()`` (each added), ``warmup`` at least and
        until every table holds ``target`` distinct rows (``--fill`` ``fill``
        asked for them); more than MAX_FILL_BATCHES: SystemExit."""
        n = 0
        while n < warmup or self.fewest() < target:
            if n >= MAX_FILL_BATCHES:
                raise SystemExit(
                    f"--fill {fill}: {n} warm-up batches hold {self.fewest():,} distinct "
                    f"rows in a table, not {target:,}: lower --fill"
                )
            batch = draw()
            self.add(batch)
            n += 1
            yield batch


# The warm-up of a cache's benchmark lasts until its batches hold this many
# times the rows the largest cache keeps, in every table: the caches full and
# evicting when timing starts, as in a job past its first steps.
FILL = 1.2
# Warm-up batches at most, however far a fill asks.
MAX_FILL_BATCHES = 2000


def add_warmup_args(ap, warmup: int, cache: str) -> None:
    """``--warmup`` and ``--fill`` of a cache's benchmark (``cache``: which
    cache's rows the fill counts)."""
    ap.add_argument("--warmup", type=int, default=warmup, help="warm-up batches, at least")
    ap.add_argument(
        "--fill",
        type=float,
        default=FILL,
        help=f"warm up until the batches hold this many times the rows {cache} keeps, in "
        "every table (the cache full and evicting when timing starts; 0: --warmup batches)",
    )


def check_fill(ap, fill: float, share: float, what: str) -> None:
    """Refuses (``ap.error``) a ``--fill`` whose rows are not a share of a
    table's: ``fill`` times ``share`` (``what``: the cache's share of the
    rows) outside [0, 1]."""
    if not 0.0 <= fill * share <= 1.0:
        ap.error(f"--fill {fill} times {what} must be a share of the rows in [0, 1]")


# Warm-up steps of each version before the timed ones.
WARMUP = 3

# What a step is timed with: wall-clock time, or (--cpu-time) the process's
# CPU time, which on a shared CPU machine leaves out the other processes' load.
CLOCK = time.perf_counter


def timed_once(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = CLOCK()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return CLOCK() - t0


def timed(fn, device, reps, warmup=3):
    for _ in range(warmup):
        fn()
    return statistics.median(timed_once(fn, device) for _ in range(reps))


def timed_turns(steps, device, reps, warmup=3):
    """Median times of steps run in turns (a, b, c, a, b, c, ...), so that a
    machine whose load drifts slows each alike."""
    for _ in range(warmup):
        for step in steps:
            step()
    times = [[] for _ in steps]
    for _ in range(reps):
        for step, t in zip(steps, times):
            t.append(timed_once(step, device))
    return [statistics.median(t) for t in times]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--lookups", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--pooling", choices=["sum", "none"], default="sum")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time steps by the process's CPU time (CPU device only)",
    )
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument(
        "--admission",
        type=int,
        metavar="THRESHOLD",
        help="also time the step with a FrequencyAdmissionStrategy of this threshold",
    )
    ap.add_argument(
        "--embedding-dtype",
        choices=[dtype_name(d) for d in EMBEDDING_DTYPES if d != torch.float32],
        help="also time the step with rows of this dtype, against float32's",
    )
    ap.add_argument(
        "--profile", action="store_true", help="print our step's kernels by device time"
    )
    ap.add_argument(
        "--ops",
        action="store_true",
        help="print the torch ops the host issues in one step of our module(s)",
    )
    args = ap.parse_args()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    global CLOCK
    if args.cpu_time:
        if args.device != "cpu":
            ap.error("--cpu-time times CPU steps only")
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)

    dev = torch.device(args.device)
    T, N, D = args.tables, args.lookups, args.dim
    g = torch.Generator().manual_seed(0)

    def draw(n):
        return [
            torch.cat([power_law(g, N, args.rows, 1.05) for _ in range(T)]).to(dev)
            for _ in range(n)
        ]

    prefill = draw(args.reps + 3)
    # A new batch for each step a version takes: the warm-up's and the timed
    # ones (timed_turns), one for --ops, three for --profile (see the docstring).
    batches = draw(WARMUP + args.reps + (1 if args.ops else 0) + (3 if args.profile else 0))
    offsets = torch.arange(T * N + 1, device=dev)  # hotness 1: one index per bag
    pooling = DynamicEmbPoolingMode.SUM if args.pooling == "sum" else DynamicEmbPoolingMode.NONE
    opt = EmbOptimType.EXACT_SGD if args.optimizer == "sgd" else EmbOptimType.ADAM
    cap = 1 << (2 * args.rows - 1).bit_length()

    def module(admit_strategy=None, dtype=torch.float32):
        opts = [
            DynamicEmbTableOptions(
                dim=D,
                max_capacity=cap,
                bucket_capacity=128,
                # Every row in device memory (the all-device table).
                local_hbm_for_values=cap * value_row_bytes(opt, D, dtype),
                admit_strategy=admit_strategy,
                embedding_dtype=dtype,
            )
            for _ in range(T)
        ]
        m = BatchedDynamicEmbeddingTablesV2(opts, None, pooling, opt, device=dev, learning_rate=0.1)
        for b in prefill:  # the hot keys in the table (or counted), the tail's to come
            m(b, offsets)
        it = iter(batches)

        def step():
            m(next(it), offsets).sum().backward()

        return m, step

    ours, ours_step = module()
    adm_step = None
    if args.admission is not None:
        strategy = FrequencyAdmissionStrategy(
            args.admission, KVCounter(capacity=args.rows, bucket_capacity=1024)
        )
        adm, adm_step = module(strategy)
        before = adm.stats.counts.sum(0).cpu()
    low_step = None
    if args.embedding_dtype is not None:
        low_dtype = getattr(torch, args.embedding_dtype)
        _, low_step = module(dtype=low_dtype)

    bags = [torch.nn.EmbeddingBag(args.rows, D, mode="sum", sparse=True).to(dev) for _ in range(T)]
    params = [p for b in bags for p in b.parameters()]
    base_opt = (
        torch.optim.SGD(params, lr=0.1)
        if args.optimizer == "sgd"
        else torch.optim.SparseAdam(params, lr=0.1)
    )
    per_table = torch.arange(N + 1, device=dev)
    it2 = iter(batches)

    def base_step():
        idx = next(it2)
        outs = [bags[t](idx[t * N : (t + 1) * N], per_table[:-1]) for t in range(T)]
        torch.cat(outs, dim=1).sum().backward()
        base_opt.step()
        base_opt.zero_grad(set_to_none=True)

    tbe = tbe_step(args, dev, batches, offsets, opt)
    # Every version in turns, step by step: a drift of the machine's speed
    # weighs on each alike.
    steps = [s for s in (ours_step, adm_step, low_step, tbe, base_step) if s is not None]
    times = dict(zip(steps, timed_turns(steps, dev, args.reps, WARMUP)))
    t_ours, t_base = times[ours_step], times[base_step]
    t_adm, t_tbe, t_low = times.get(adm_step), times.get(tbe), times.get(low_step)
    if adm_step is not None:
        per_step = (adm.stats.counts.sum(0).cpu() - before) / (WARMUP + args.reps)
    if args.ops:
        ops = [f"{op_count(ours_step, dev)} without admission"]
        if adm_step is not None:
            ops.append(f"{op_count(adm_step, dev)} with")
        print("torch ops per step (outermost aten and dynamicemb calls): " + ", ".join(ops))
    if args.profile:
        profile_step(ours_step, dev)
        if adm_step is not None:
            profile_step(adm_step, dev)
        if low_step is not None:
            profile_step(low_step, dev)
    print(
        f"device {dev}, {T} tables x {N} lookups, dim {D}, {args.optimizer}, pooling "
        f"{args.pooling}, "
        f"{torch.get_num_threads()} threads" + (", CPU time" if args.cpu_time else "")
    )
    ref = t_tbe if t_tbe else t_base
    name = "FBGEMM TBE" if t_tbe else "EmbeddingBag"
    print(f"| implementation | train step (ms) | ratio to {name} |")
    print("|---|---|---|")
    print(f"| BatchedDynamicEmbeddingTablesV2 | {t_ours * 1e3:.2f} | {t_ours / ref:.2f} |")
    if t_adm is not None:
        print(
            f"| BatchedDynamicEmbeddingTablesV2, FrequencyAdmissionStrategy({args.admission}) "
            f"| {t_adm * 1e3:.2f} | {t_adm / ref:.2f} |"
        )
    if t_low is not None:
        print(
            f"| BatchedDynamicEmbeddingTablesV2, rows in {args.embedding_dtype} "
            f"| {t_low * 1e3:.2f} | {t_low / ref:.2f} |"
        )
    if t_tbe:
        print(f"| FBGEMM SplitTableBatchedEmbeddingBagsCodegen | {t_tbe * 1e3:.2f} | 1.00 |")
    else:
        print("| FBGEMM SplitTableBatchedEmbeddingBagsCodegen | n/a (not supported here) | |")
    print(f"| torch.nn.EmbeddingBag (sparse) | {t_base * 1e3:.2f} | {t_base / ref:.2f} |")
    if t_adm is not None:
        graphs = ""
        if ours._graphs is not None:
            graphs = (
                f"; lookups replayed from CUDA graphs: {ours._graphs.replays} without, "
                f"{adm._graphs.replays} with admission"
            )
        print(
            f"admission overhead: {100 * (t_adm / t_ours - 1):+.1f} % "
            f"(per step {per_step[StatCol.ADMISSIONS]:.0f} keys admitted, "
            f"{per_step[StatCol.REJECTIONS]:.0f} rejected{graphs})"
        )
    if t_low is not None:
        print(
            f"rows in {args.embedding_dtype} against float32: step time {t_low / t_ours:.3f}x "
            f"(row bytes {value_row_bytes(opt, D, low_dtype)} against "
            f"{value_row_bytes(opt, D, torch.float32)})"
        )
    if dev.type == "cuda":
        uniq = statistics.mean(
            sum(int(torch.unique(b[t * N : (t + 1) * N]).numel()) for t in range(T))
            for b in batches
        )
        bw = copy_bandwidth(dev)
        state = {"sgd": 0, "adam": 2 * D}[args.optimizer]
        # Must move at least: keys in, output out, gradient in, and each unique
        # row (and its optimizer state) read once and written once.
        floor_bytes = T * N * 8 + 2 * T * N * D * 4 + uniq * (D + state) * 4 * 2
        t_floor = floor_bytes / bw
        print(
            f"| HBM floor ({floor_bytes / 1e6:.0f} MB at {bw / 1e12:.2f} TB/s copy, {uniq:.0f} "
            "unique keys) "
            f"| {t_floor * 1e3:.2f} | {t_floor / ref:.2f} |"
        )


def copy_bandwidth(dev):
    """Device-to-device copy bandwidth in bytes (read + written) per second."""
    src = torch.empty(1 << 28, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), dev, 10)
    return 2 * src.numel() * 4 / t


def op_count(step, dev):
    """The torch ops one step issues from Python: the aten and dynamicemb
    calls that no other such call makes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if host_op(e))


def _op(e):
    return e.name.startswith(("aten::", "dynamicemb::"))


def host_op(e):
    """Whether a profiler event is a torch op the step issued from Python: an
    aten or dynamicemb call that no other such call makes."""
    if not _op(e):
        return False
    p = e.cpu_parent
    while p is not None:
        if _op(p):
            return False
        p = p.cpu_parent
    return True


def profile_step(step, dev):
    """Prints the kernels of a few steps by total device time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))


def tbe_step(args, dev, batches, offsets, opt):
    """FBGEMM TBE's train step on the same batches, or None where this
    optimizer/device is not supported by the installed fbgemm_gpu."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    cuda = dev.type == "cuda"
    loc = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
    cdev = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
    pooling = PoolingMode.SUM if args.pooling == "sum" else PoolingMode.NONE
    try:
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(args.rows, args.dim, loc, cdev)] * args.tables,
            optimizer=opt,
            learning_rate=0.1,
            pooling_mode=pooling,
            device=dev,
        )
    except (AssertionError, RuntimeError, NotImplementedError) as e:
        print(f"FBGEMM TBE skipped: {str(e).splitlines()[0]}")
        return None
    it = iter(batches)

    def step():
        tbe(next(it), offsets).sum().backward()

    return step


if __name__ == "__main__":
    main()
