"""Where a cache's training step spends its device time, stage by stage.

    python tools/bench/storage_stages.py [--device cuda] [--tables 10] [--rows 1677824]
        [--dim 128] [--lookups 65536] [--budget 0.1] [--warmup 12] [--steps 4]

A ``BatchedDynamicEmbeddingTablesV2`` of ``--tables`` tables (dim ``--dim``,
``--rows`` rows each, a multiple of the bucket capacity 128) with
``caching=True`` and a device cache of ``--budget`` of each table's rows,
SGD, pooled SUM, hotness 1, ``--lookups`` ids per table and step from a power
law (exponent 1.05). ``--warmup`` batches train first; then ``--steps`` new
batches (new to the tables, as in training: misses, victims, new rows) train
under torch.profiler, first with the training lookup run eagerly, then
replayed from its CUDA graph. Prints, per step, the device time (kernels
launched inside the range) and host time of each ``dynamicemb:`` range (the
cache's stages: ``cache_insert``, ``cache_backing``, ``cache_fill``,
``cache_overflow``; ``unique``, ``pool``, ``update``, ``lookup_graph``) and
of the kernels that dominate them (the table's runs, ``copy_rows``).
"""

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embedding_bench import power_law

from dynamicemb import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

# The kernels printed beside the ranges (by a part of their name).
KERNELS = ("run_kernel", "copy_rows_kernel", "prefind")


def build(args, device: torch.device) -> BatchedDynamicEmbeddingTablesV2:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    rb = value_row_bytes(EmbOptimType.EXACT_SGD, args.dim, torch.float32)
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
        optimizer=EmbOptimType.EXACT_SGD,
        device=device,
        learning_rate=0.01,
    )
    m.check_values = False
    return m


def stage_lines(prof, steps: int) -> list[str]:
    out = []
    for e in prof.key_averages():
        if e.key.startswith("dynamicemb:") or any(k in e.key for k in KERNELS):
            out.append(
                f"   {e.key[:70]:70s} device {e.device_time_total / 1e3 / steps:.3f} ms  "
                f"host {e.cpu_time_total / 1e3 / steps:.3f} ms  calls {e.count / steps:.1f}"
            )
    return out


def run(args) -> None:
    device = torch.device(args.device)
    m = build(args, device)
    g = torch.Generator().manual_seed(0)
    n = args.tables * args.lookups
    offsets = torch.arange(n + 1, device=device)

    def batch():
        ids = [power_law(g, args.lookups, args.rows, 1.05) for _ in range(args.tables)]
        return torch.cat(ids).to(device)

    for _ in range(args.warmup):
        m(batch(), offsets).sum().backward()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    for graphs in (False, True) if device.type == "cuda" else (False,):
        m.cuda_graphs = graphs
        batches = [batch() for _ in range(args.steps)]
        if device.type == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            for b in batches:
                m(b, offsets).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
        print(f"== budget {args.budget}, lookup {'from its CUDA graph' if graphs else 'eager'}")
        print("\n".join(stage_lines(prof, args.steps)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tables", type=int, default=10)
    ap.add_argument("--rows", type=int, default=1_677_824)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lookups", type=int, default=65536)
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args(argv)
    if args.rows % 128 or min(args.tables, args.rows, args.dim, args.lookups, args.steps) < 1:
        ap.error("--rows must be a positive multiple of 128; sizes and --steps positive")
    if not 0.0 < args.budget <= 1.0:
        ap.error(f"--budget must be a share in (0, 1], got {args.budget}")
    return args


if __name__ == "__main__":
    run(parse_args())
