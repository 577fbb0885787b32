"""Where a cache's training step spends its time, stage by stage, and how
fast rows cross the bus each way they could.

    python tools/bench/storage_stages.py [--device cuda] [--tables 10] [--rows 1677824]
        [--dim 128] [--lookups 65536] [--budget 0.1] [--optimizer sgd|adam] [--warmup 12]
        [--fill 1.2] [--steps 4] [--timed 5] [--rounds 2] [--transport-gib 4]
        [--parts steps stages transport]

A ``BatchedDynamicEmbeddingTablesV2`` of ``--tables`` tables (dim ``--dim``,
``--rows`` rows each, a multiple of the bucket capacity 128) with
``caching=True`` and a device cache of ``--budget`` of each table's rows,
``--optimizer``, pooled SUM, hotness 1, ``--lookups`` ids per table and step
from a power law (exponent 1.05). New batches train first, ``--warmup`` at
least, until they hold ``--fill`` (1.2) times the rows the cache keeps, in
every table: the cache full and evicting, as in a job past its first steps,
before any part measures it (each variant measured on a cache still filling
would move fewer rows than the ones after it). Every batch after is new (new
to the tables, as in training: misses, victims, new rows). The parts
(``--parts``):

* ``steps``: the mean step (forward, backward with the fused update) over
  ``--rounds`` turns of ``--timed`` steps (the variants taking turns), the
  device synchronized before and after each turn, of the
  cache with its victims' rows written at once through the mapped pointer
  (``HostWrites.max_rows = 0``, the default) and staged and written to host
  memory on a side stream (``max_rows = None``), every host-bound copy in
  address order, each without and with the next batch prefetched on a side
  stream between the forward and the backward (as TorchRec's prefetch
  pipeline runs it); the rows each moved per step.
* ``stages``: ``--steps`` steps under torch.profiler, the training lookup
  run eagerly, then replayed from its CUDA graph, then eagerly with each
  step's batch prefetched by the step before and the next batch prefetched
  on a side stream (``prefetch_find``, ``prefetch_insert``,
  ``prefetch_write_back``, ``prefetch_fill``): per step, the device
  time (kernels launched inside the range) and host time of each
  ``dynamicemb:`` range (the cache's stages: ``cache_insert``,
  ``cache_backing``, ``cache_fill``, ``cache_overflow``,
  ``cache_write_back``; ``unique``, ``pool``, ``update``, ``lookup_graph``)
  and of the kernels that dominate them (the table's runs, ``copy_rows``),
  then the step's heaviest kernels by device time (on a GPU).
* ``transport`` (GPU): as many rows of the step's width as a step wrote back
  (measured in ``steps``, or ``--lookups`` per table), moved between device
  memory and random rows of a pinned host region of ``--transport-gib`` GiB,
  each way: by ``copy_rows`` through the mapped pointer (the rows in random
  order, and sorted by address), by ``copy_rows`` to or from one contiguous
  pinned buffer, by the copy engine (one copy of the contiguous rows), and
  by the host (``index_copy_`` / ``index_select`` between the pinned buffer
  and the random rows, torch's threads): the GB/s of each, which says whether
  staging through the copy engine and a host scatter would beat the kernel's
  scattered writes; then the kernel's scattered writes and reads again (both
  orders) with the host region in 2 MiB transparent huge pages registered with CUDA
  (whether 4 KiB pages bound them; n/a where the kernel grants none).
"""

import argparse
import os
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embedding_bench import SeenRows, add_warmup_args, check_fill, power_law

from dynamicemb import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage import space as sp
from dynamicemb.types import MemoryType

# The kernels printed beside the ranges (by a part of their name).
KERNELS = ("run_kernel", "copy_rows_kernel", "prefind")
# How many of the step's kernels the stages part lists by device time.
TOP_KERNELS = 15
PARTS = ("steps", "stages", "transport")


def optimizer_type(name: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return EmbOptimType.ADAM if name == "adam" else EmbOptimType.EXACT_SGD


def build(args, device: torch.device) -> BatchedDynamicEmbeddingTablesV2:
    opt = optimizer_type(args.optimizer)
    rb = value_row_bytes(opt, args.dim, torch.float32)
    options = [
        DynamicEmbTableOptions(
            dim=args.dim,
            max_capacity=args.rows,
            bucket_capacity=128,
            caching=True,
            local_hbm_for_values=int(args.rows * rb * args.budget),
        )
        for _ in range(args.tables)
    ]
    m = BatchedDynamicEmbeddingTablesV2(
        options,
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=opt,
        device=device,
        learning_rate=0.01,
    )
    m.check_values = False
    return m


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stage_lines(prof, steps: int) -> list[str]:
    out = []
    events = prof.key_averages()
    for e in events:
        if e.key.startswith("dynamicemb:") or any(k in e.key for k in KERNELS):
            out.append(
                f"   {e.key[:70]:70s} device {e.device_time_total / 1e3 / steps:.3f} ms  "
                f"host {e.cpu_time_total / 1e3 / steps:.3f} ms  calls {e.count / steps:.1f}"
            )
    # The step's heaviest device kernels, whichever range launched them (the
    # sorts, selections and copies between the table's kernels); not the
    # ranges' own spans on the device timeline (user annotations).
    kernels = [
        e
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.key.startswith("dynamicemb:")
    ]
    kernels.sort(key=lambda e: -e.self_device_time_total)
    if kernels:
        out.append(f"   the {min(TOP_KERNELS, len(kernels))} kernels with the most device time:")
    for e in kernels[:TOP_KERNELS]:
        out.append(
            f"   {e.key[:70]:70s} device {e.self_device_time_total / 1e3 / steps:.3f} ms  "
            f"calls {e.count / steps:.1f}"
        )
    return out


class Run:
    """The module, its batches (each new) and the loops that train it."""

    def __init__(self, args) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.m = build(args, self.device)
        self.g = torch.Generator().manual_seed(0)
        n = args.tables * args.lookups
        self.offsets = torch.arange(n + 1, device=self.device)
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def batch(self) -> torch.Tensor:
        a = self.args
        ids = [power_law(self.g, a.lookups, a.rows, 1.05) for _ in range(a.tables)]
        return torch.cat(ids).to(self.device)

    def train(self, batches, prefetch: bool, ahead=None) -> None:
        """Trains ``batches``, each prefetched (on a side stream on a GPU)
        between the forward and the backward of the one before it; the last
        one's backward waits on the prefetch of ``ahead`` (the batch the
        next call trains first), if given."""
        m = self.m
        for i, b in enumerate(batches):
            out = m(b, self.offsets)
            after = batches[i + 1] if i + 1 < len(batches) else ahead
            if prefetch and after is not None:
                if self.side is not None:
                    self.side.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(self.side):
                        m.prefetch(after, self.offsets)
                else:
                    m.prefetch(after, self.offsets)
            out.sum().backward()

    def moved(self) -> int:
        s = self.m.storage
        return int(s.host_reads) + int(s.host_writes)


def steps_part(run: Run) -> int:
    """Prints the mean step of each variant; returns the rows a step wrote
    back (its victims) with the victims written at once. The variants take
    turns, ``--rounds`` times ``--timed`` steps each (the rows a step moves
    drift up as the host table comes to hold more of the batches' keys:
    turns, every other one in the reverse order, spread that drift over
    every variant alike); each turn starts with
    an untimed step, and where the variant prefetches, every step, timed or
    not, prefetches the batch after it (the last timed one a batch no step
    trains), so each timed step holds one prefetch."""
    a, m = run.args, run.m
    writes = m.storage.backing.writes
    rb = max(m.layout.row_bytes)
    default = writes.max_rows

    def max_rows(staged: bool) -> int | None:  # HostWrites.max_rows of each way
        return None if staged else 0

    variants = [(staged, prefetch) for staged in (False, True) for prefetch in (False, True)]
    secs = dict.fromkeys(variants, 0.0)
    moved = dict.fromkeys(variants, 0)
    writes_at_once = 0
    for turn in range(a.rounds):
        # Every other turn backwards: a steady drift weighs on each variant alike.
        for staged, prefetch in variants if turn % 2 == 0 else variants[::-1]:
            writes.max_rows = max_rows(staged)
            batches = [run.batch() for _ in range(a.timed + 2)]
            run.train(batches[:1], prefetch, ahead=batches[1])
            before, w0 = run.moved(), int(m.storage.host_writes)
            sync(run.device)
            t = time.perf_counter()
            run.train(batches[1:-1], prefetch, ahead=batches[-1])
            sync(run.device)
            secs[(staged, prefetch)] += time.perf_counter() - t
            moved[(staged, prefetch)] += run.moved() - before
            if not staged and not prefetch:
                writes_at_once += int(m.storage.host_writes) - w0
    writes.max_rows = default
    steps = a.rounds * a.timed
    print(
        f"== steps: mean of {steps} new batches each ({a.rounds} turns of {a.timed}), "
        f"{a.optimizer}, budget {a.budget}"
    )
    for staged, prefetch in variants:
        how = "staged, written on a side stream" if staged else "written at once"
        how += " (default)" if max_rows(staged) == default else ""
        per = moved[(staged, prefetch)] / steps
        print(
            f"   victims {how:44s} prefetch {'yes' if prefetch else 'no ':3s}: "
            f"{1e3 * secs[(staged, prefetch)] / steps:7.2f} ms/step, {per:,.0f} rows moved "
            f"({per * rb / 1e6:.1f} MB)",
            flush=True,
        )
    return writes_at_once // steps


def stages_part(run: Run) -> None:
    a, device = run.args, run.device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    default = run.m.cuda_graphs
    graphed = device.type == "cuda"
    for graphs, prefetch in [(False, False)] + [(True, False)] * graphed + [(False, True)]:
        run.m.cuda_graphs = graphs
        # With prefetch, every profiled step trains a batch the step before
        # prefetched and prefetches the next (the last a batch no step trains),
        # as in the steps part.
        batches = [run.batch() for _ in range(a.steps + 2)]
        run.train(batches[:1], prefetch, ahead=batches[1])  # a first step of this variant
        sync(device)
        with profile(activities=activities) as prof:
            run.train(batches[1:-1], prefetch, ahead=batches[-1])
            sync(device)
        how = "from its CUDA graph" if graphs else "eager"
        print(f"== budget {a.budget}, lookup {how}, prefetch {'yes' if prefetch else 'no'}")
        print("\n".join(stage_lines(prof, a.steps)))
    run.m.cuda_graphs = default


def _rate(fn, nbytes: int, device: torch.device, reps: int = 5) -> float:
    """GB/s of ``fn`` moving ``nbytes`` (once warm)."""
    fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return reps * nbytes / (time.perf_counter() - t) / 1e9


_HUGE = 2 << 20  # a transparent huge page


def _anon_huge_bytes() -> int:
    """This process's anonymous memory in huge pages (/proc/self/smaps_rollup)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def huge_region(nbytes: int, device: torch.device):
    """``(keep, device view, huge bytes)``: host memory of ``nbytes`` in
    2 MiB transparent huge pages (``MADV_HUGEPAGE``, where the kernel grants
    them), pinned and mapped into the device's address space with
    ``cudaHostRegister``; or ``(None, why, 0)``."""
    import mmap

    size = -(-nbytes // _HUGE) * _HUGE
    try:
        before = _anon_huge_bytes()
        buf = mmap.mmap(-1, size + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(buf, dtype=torch.uint8)
        start = -whole.data_ptr() % _HUGE
        host = whole[start : start + size]
        host.fill_(0)  # every page backed before it is pinned
        huge = _anon_huge_bytes() - before
        mapped = 2  # cudaHostRegisterMapped
        err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), size, mapped)
        if int(err) != 0:
            return None, f"cudaHostRegister failed ({err})", 0

        class View:  # the same pointer on the device (unified addressing)
            __cuda_array_interface__ = {
                "shape": (size,),
                "typestr": "|u1",
                "data": (host.data_ptr(), False),
                "version": 3,
            }

        return (buf, whole, host), torch.as_tensor(View(), device=device), huge
    except Exception as e:  # no THP, no registration: the line reads n/a
        return None, f"{type(e).__name__}: {e}", 0


def transport_part(args, rows: int, rb: int) -> None:
    """Prints the GB/s of each way of moving ``rows`` rows of ``rb`` bytes
    (see the module docstring)."""
    device = torch.device(args.device)
    region = int(args.transport_gib * 2**30) // rb
    rows = max(1, min(rows, region))
    host = sp.allocate(region * rb, MemoryType.HOST, device)
    pinned = sp.allocate(rows * rb, MemoryType.HOST, device)
    g = torch.Generator().manual_seed(1)
    pick = torch.randperm(region, generator=g)[:rows]
    scattered = (pick * rb).to(device)
    ordered = torch.sort(scattered).values
    packed = torch.arange(rows, device=device) * rb
    dev = torch.randint(0, 256, (rows * rb,), dtype=torch.uint8, device=device)
    nbytes = torch.full((rows,), rb, dtype=torch.int64, device=device)
    hseg, pseg, dseg = (
        (host.data, host.data.new_empty(0)),
        (pinned.data, pinned.data.new_empty(0)),
        (dev, dev.new_empty(0)),
    )
    table = host.host_view.view(region, rb)
    stage = pinned.host_view.view(rows, rb)
    total = rows * rb
    print(
        f"== transport: {rows:,} rows of {rb} bytes ({total / 1e6:.1f} MB), host region "
        f"{args.transport_gib:g} GiB, {torch.get_num_threads()} host threads"
    )

    def kernel(dst, dst_off, src, src_off):
        return lambda: sp.copy_rows(dst, dst_off, src, src_off, nbytes)

    ways = [
        ("device -> host rows, copy_rows, random order", kernel(hseg, scattered, dseg, packed)),
        ("device -> host rows, copy_rows, sorted by address", kernel(hseg, ordered, dseg, packed)),
        ("device -> contiguous pinned buffer, copy_rows", kernel(pseg, packed, dseg, packed)),
        (
            "device -> contiguous pinned buffer, copy engine",
            lambda: pinned.host_view.copy_(dev, non_blocking=True),
        ),
        ("pinned buffer -> host rows, host index_copy_", lambda: table.index_copy_(0, pick, stage)),
        ("host rows -> device, copy_rows, random order", kernel(dseg, packed, hseg, scattered)),
        ("host rows -> device, copy_rows, sorted by address", kernel(dseg, packed, hseg, ordered)),
        ("contiguous pinned buffer -> device, copy_rows", kernel(dseg, packed, pseg, packed)),
        (
            "contiguous pinned buffer -> device, copy engine",
            lambda: dev.copy_(pinned.host_view, non_blocking=True),
        ),
        (
            "host rows -> pinned buffer, host index_select",
            lambda: torch.index_select(table, 0, pick, out=stage),
        ),
    ]
    for what, fn in ways:
        print(f"   {what:52s} {_rate(fn, total, device):6.1f} GB/s", flush=True)
    # The same host rows in 2 MiB pages: whether the scattered copies are
    # bound by the device's translation of 4 KiB host pages.
    keep, huge, got = huge_region(region * rb, device)
    if keep is None:
        print(f"   host rows in 2 MiB pages: n/a ({huge})")
        return
    print(f"   host rows in 2 MiB pages ({got / 2**30:.2f} GiB of the region in huge pages):")
    hhuge = (huge, huge.new_empty(0))
    for what, fn in (
        ("device -> host rows, copy_rows, random order", kernel(hhuge, scattered, dseg, packed)),
        ("device -> host rows, copy_rows, sorted by address", kernel(hhuge, ordered, dseg, packed)),
        ("host rows -> device, copy_rows, random order", kernel(dseg, packed, hhuge, scattered)),
        ("host rows -> device, copy_rows, sorted by address", kernel(dseg, packed, hhuge, ordered)),
    ):
        print(f"   {what:52s} {_rate(fn, total, device):6.1f} GB/s", flush=True)
    sync(device)
    torch.cuda.cudart().cudaHostUnregister(keep[2].data_ptr())


def warm_up(r: Run) -> None:
    """Trains new batches, ``--warmup`` at least, until they hold ``--fill``
    times the rows the cache keeps, in every table (the cache full and
    evicting before any part measures it)."""
    a = r.args
    seen = SeenRows(a.tables, a.rows, r.device)
    n = 0
    for b in seen.warm_up(r.batch, a.warmup, int(a.fill * a.budget * a.rows), a.fill):
        r.train([b], prefetch=False)
        n += 1
    print(f"== warm-up: {n} new batches, {seen.fewest():,}+ distinct rows a table", flush=True)


def run(args) -> None:
    r = Run(args)
    warm_up(r)
    victims = None
    if "steps" in args.parts:
        victims = steps_part(r)
    if "stages" in args.parts:
        stages_part(r)
    if "transport" in args.parts and r.device.type == "cuda":
        rb = max(r.m.layout.row_bytes)
        rows = victims if victims else args.tables * args.lookups // 4
        del r
        transport_part(args, rows, rb)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tables", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1_677_824)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lookups", type=int, default=65536)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    add_warmup_args(ap, 12, "the cache")
    ap.add_argument("--steps", type=int, default=4, help="profiled steps")
    ap.add_argument("--timed", type=int, default=5, help="timed steps per variant and turn")
    ap.add_argument("--rounds", type=int, default=2, help="turns of the variants")
    ap.add_argument("--transport-gib", type=float, default=4.0)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    args = ap.parse_args(argv)
    sizes = (args.tables, args.rows, args.dim, args.lookups, args.steps, args.timed, args.rounds)
    if args.rows % 128 or min(sizes) < 1:
        ap.error("--rows must be a positive multiple of 128; sizes and step counts positive")
    if not 0.0 < args.budget <= 1.0:
        ap.error(f"--budget must be a share in (0, 1], got {args.budget}")
    check_fill(ap, args.fill, args.budget, "--budget")
    if args.transport_gib <= 0:
        ap.error(f"--transport-gib must be positive, got {args.transport_gib}")
    return args


if __name__ == "__main__":
    run(parse_args())
