"""Ops and kernels of one training step of BatchedDynamicEmbeddingTablesV2.

    python tools/bench/step_ops.py [--device cpu|cuda] [--tables 4] [--lookups 4096]
        [--dim 64] [--rows 100000] [--graphs] [--list CONFIG]

One step = forward + backward (the fused optimizer's update) of the
all-device table, on a batch the module did not see before (after a few
batches that fill the table), per configuration: pooling SUM and NONE
(sequence), SGD and Adam, without and with a
``FrequencyAdmissionStrategy(2)``. Prints, per configuration, the torch ops
the host issues (the outermost aten and dynamicemb calls, as
``embedding_bench.py --ops`` counts them) and, on a GPU, the CUDA kernels
the step runs (the profiler's kernel events; memcpy and memset apart).

The lookup runs eagerly unless ``--graphs`` (a lookup replayed from a CUDA
graph issues one host op, yet runs the same kernels). ``--list CONFIG`` (e.g.
``sum-sgd-admit``) prints that configuration's ops (and kernels) one a line,
in the order they ran.
"""

import argparse
import collections

import torch
from embedding_bench import (  # tools/bench/embedding_bench.py, next to this script
    host_op,
    power_law,
)
from torch.profiler import ProfilerActivity, profile

from dynamicemb import (
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

CONFIGS = [
    (pooling, opt, admit)
    for pooling in ("sum", "none")
    for opt in ("sgd", "adam")
    for admit in (False, True)
]


def config_name(pooling, opt, admit):
    return f"{pooling}-{opt}" + ("-admit" if admit else "")


def step_events(step, dev):
    """(host ops, CUDA kernels) of one call of ``step``: names in the order
    they started."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    host = [e.name for e in events if host_op(e)]
    kernels = [
        e.name
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not e.name.startswith(("Memcpy", "Memset"))
    ]
    return host, kernels


def build_step(args, dev, pooling, opt, admit):
    """A module of the configuration, its table filled by a few batches, and
    the step of a new batch."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    T, N = args.tables, args.lookups
    g = torch.Generator().manual_seed(0)

    def draw():
        return torch.cat([power_law(g, N, args.rows, 1.05) for _ in range(T)]).to(dev)

    offsets = torch.arange(T * N + 1, device=dev)  # hotness 1
    mode = DynamicEmbPoolingMode.SUM if pooling == "sum" else DynamicEmbPoolingMode.NONE
    optim = EmbOptimType.EXACT_SGD if opt == "sgd" else EmbOptimType.ADAM
    cap = 1 << (2 * args.rows - 1).bit_length()
    strategy = (
        FrequencyAdmissionStrategy(2, KVCounter(capacity=args.rows, bucket_capacity=1024))
        if admit
        else None
    )
    opts = [
        DynamicEmbTableOptions(
            dim=args.dim,
            max_capacity=cap,
            bucket_capacity=128,
            local_hbm_for_values=1 << 40,
            admit_strategy=strategy,
        )
        for _ in range(T)
    ]
    m = BatchedDynamicEmbeddingTablesV2(opts, None, mode, optim, device=dev, learning_rate=0.1)
    m.cuda_graphs = args.graphs
    for _ in range(3):
        m(draw(), offsets).sum().backward()
    batch = draw()

    def step():
        m(batch, offsets).sum().backward()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--lookups", type=int, default=4096, help="ids per table in a batch")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--graphs", action="store_true", help="replay lookups from CUDA graphs")
    ap.add_argument("--list", metavar="CONFIG", help="print this configuration's ops")
    args = ap.parse_args()
    dev = torch.device(args.device)
    names = [config_name(*c) for c in CONFIGS]
    if args.list is not None and args.list not in names:
        ap.error(f"--list takes one of {names}, got {args.list!r}")
    cuda = dev.type == "cuda"
    print(
        f"device {dev}, {args.tables} tables x {args.lookups} lookups, dim {args.dim}, "
        f"lookup {'from CUDA graphs' if args.graphs else 'eager'}"
    )
    print("| configuration | host ops | CUDA kernels |" if cuda else "| configuration | host ops |")
    print("|---|---|---|" if cuda else "|---|---|")
    listed = None
    for c, name in zip(CONFIGS, names):
        if args.list is not None and name != args.list:
            continue
        step = build_step(args, dev, *c)
        host, kernels = step_events(step, dev)
        print(f"| {name} | {len(host)} | {len(kernels)} |" if cuda else f"| {name} | {len(host)} |")
        if name == args.list:
            listed = host, kernels
    if listed is not None:
        host, kernels = listed
        print(f"\nhost ops of {args.list}: {dict(collections.Counter(host))}")
        for op in host:
            print("  " + op)
        if cuda:
            print(f"\nCUDA kernels of {args.list}:")
            for k in kernels:
                print("  " + k[:120])


if __name__ == "__main__":
    main()
