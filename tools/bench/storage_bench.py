"""Train-step time of the storage tiers: a device cache at several ratios of
the table (with and without prefetch), the hybrid table, the all-device
table, against FBGEMM TBE with EmbeddingLocation.MANAGED_CACHING on the same
batches.

    python tools/bench/storage_bench.py [--device cuda] [--tables 4] [--rows 4000000]
        [--dim 128] [--lookups 65536] [--optimizer adam] [--ratios 1.0,0.5,0.1]
        [--hybrid 0.5] [--steps 20] [--warmup 5]

One step = forward + backward (``out.sum()``) + the fused update, keys drawn
from a power law (exponent 1.05) over ``rows`` ids per table, hotness 1,
pooled SUM. Every timed batch is trained once before the timing, so every key
exists (the steady state: hot keys cached, the rest in host memory). With
prefetch, batch i + 1 is prefetched on a side stream between the forward and
the backward of batch i, and the next forward waits for it, as TorchRec's
``TrainPipelinePrefetch`` runs it (FBGEMM's with ``prefetch_pipeline=True``).
The cache of ratio r holds r of the table's rows (``local_hbm_for_values``,
FBGEMM's ``cache_load_factor``); the hybrid table keeps that share of its
rows in device memory and the rest in pinned host memory. Prints the median
step of each configuration as a markdown table; on the CPU FBGEMM has no
managed cache, and both tiers are host memory.
"""

import argparse
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embedding_bench import power_law

from dynamicemb import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.types import MemoryType


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_steps(step_fn, batches, dev, warmup):
    """Median seconds of ``step_fn(i)`` over the timed batches."""
    for i in range(warmup):
        step_fn(i)
    times = []
    for i in range(warmup, len(batches)):
        sync(dev)
        t0 = time.perf_counter()
        step_fn(i)
        sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pipelined(forward, backward, prefetch, batches, dev):
    """step(i): forward i, prefetch i + 1 (side stream on CUDA), backward i;
    the next forward waits for the prefetch."""
    side = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def step(i):
        out = forward(i)
        if prefetch is not None and i + 1 < len(batches):
            if side is not None:
                main = torch.cuda.current_stream(dev)
                with torch.cuda.stream(side):
                    prefetch(i + 1, main)
                backward(out)
                main.wait_stream(side)
            else:
                prefetch(i + 1, None)
                backward(out)
        else:
            backward(out)

    return step


def dynamicemb_module(args, dev, opt, budget_fraction: float, caching: bool):
    rb = value_row_bytes(opt, args.dim, torch.float32)
    cap = -(-args.rows // 128) * 128
    options = [
        DynamicEmbTableOptions(
            dim=args.dim,
            max_capacity=cap,
            bucket_capacity=128,
            caching=caching,
            local_hbm_for_values=int(budget_fraction * cap * rb),
        )
        for _ in range(args.tables)
    ]
    return BatchedDynamicEmbeddingTablesV2(
        options, None, DynamicEmbPoolingMode.SUM, opt, device=dev, learning_rate=0.01
    )


def time_dynamicemb(args, dev, opt, batches, offsets, fraction, caching, prefetch):
    m = dynamicemb_module(args, dev, opt, fraction, caching)
    for b in batches:  # every key of the timed batches exists
        m(b, offsets).sum().backward()
    mem = (m.memory_usage(MemoryType.DEVICE), m.memory_usage(MemoryType.HOST))
    step = pipelined(
        lambda i: m(batches[i], offsets),
        lambda out: out.sum().backward(),
        (lambda i, s: m.prefetch(batches[i], offsets, forward_stream=s)) if prefetch else None,
        batches,
        dev,
    )
    t = run_steps(step, batches, dev, args.warmup)
    return t, mem, int(getattr(m.storage, "overflows", 0))


def release(dev) -> None:
    """Frees what the last configuration held before the next allocates."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def time_tbe(args, dev, opt, batches, offsets, ratio, prefetch):
    """FBGEMM TBE with a managed cache of ``ratio`` of the rows, or None where
    the installed fbgemm_gpu cannot build it (the CPU has no managed cache)."""
    if dev.type != "cuda":
        return None
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        CacheAlgorithm,
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    try:
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(args.rows, args.dim, EmbeddingLocation.MANAGED_CACHING, ComputeDevice.CUDA)]
            * args.tables,
            optimizer=opt,
            learning_rate=0.01,
            pooling_mode=PoolingMode.SUM,
            cache_load_factor=ratio,
            cache_algorithm=CacheAlgorithm.LRU,
            prefetch_pipeline=prefetch,
            device=dev,
        )
    except (AssertionError, RuntimeError, NotImplementedError, TypeError) as e:
        print(f"FBGEMM TBE (cache ratio {ratio}) skipped: {str(e).splitlines()[0]}")
        return None

    def forward(i):
        if prefetch and i == 0:
            tbe.prefetch(batches[0], offsets)
        return tbe(batches[i], offsets)

    step = pipelined(
        forward,
        lambda out: out.sum().backward(),
        (lambda i, s: tbe.prefetch(batches[i], offsets, forward_stream=s)) if prefetch else None,
        batches,
        dev,
    )
    for i in range(len(batches)):  # the same warm-up as dynamicemb's
        step(i)
    return run_steps(step, batches, dev, args.warmup)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows per table")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lookups", type=int, default=65536, help="per table and step")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    ap.add_argument("--ratios", default="1.0,0.5,0.1", help="cache sizes, fractions of the table")
    ap.add_argument("--hybrid", type=float, default=0.5, help="device share of the hybrid table")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-tbe", action="store_true", help="skip the FBGEMM baselines")
    args = ap.parse_args()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    dev = torch.device(args.device)
    opt = EmbOptimType.EXACT_SGD if args.optimizer == "sgd" else EmbOptimType.ADAM
    T, N = args.tables, args.lookups
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.cat([power_law(g, N, args.rows, 1.05) for _ in range(T)]).to(dev)
        for _ in range(args.warmup + args.steps)
    ]
    offsets = torch.arange(T * N + 1, device=dev)
    rb = value_row_bytes(opt, args.dim, torch.float32)
    table_gib = T * args.rows * rb / 2**30
    uniq = statistics.mean(
        sum(int(torch.unique(b[t * N : (t + 1) * N]).numel()) for t in range(T)) for b in batches
    )
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(
        f"{name}, torch {torch.__version__}: {T} tables x {args.rows:,} rows, dim {args.dim}, "
        f"{args.optimizer} ({rb} bytes a row, {table_gib:.1f} GiB of rows), {N:,} lookups per "
        f"table and step ({uniq:,.0f} distinct keys), median of {args.steps} steps after "
        f"{args.warmup}"
    )
    ratios = [float(r) for r in args.ratios.split(",")]
    t_device, mem, _ = time_dynamicemb(args, dev, opt, batches, offsets, 1.0, False, False)
    release(dev)
    rows = [("all-device table", "", t_device, None, mem, 0)]
    t, mem, _ = time_dynamicemb(args, dev, opt, batches, offsets, args.hybrid, False, False)
    release(dev)
    rows.append((f"hybrid, {args.hybrid:.0%} of the rows on the device", "", t, None, mem, 0))
    for r in ratios:
        for prefetch in (False, True):
            t, mem, over = time_dynamicemb(args, dev, opt, batches, offsets, r, True, prefetch)
            release(dev)
            tbe = None if args.no_tbe else time_tbe(args, dev, opt, batches, offsets, r, prefetch)
            release(dev)
            rows.append((f"cache {r:g}", "yes" if prefetch else "no", t, tbe, mem, over))
    print()
    print(
        "| storage | prefetch | dynamicemb (ms) | FBGEMM managed cache (ms) | dynamicemb / "
        "FBGEMM | / all-device | device GiB | host GiB | overflow keys |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, pf, t, tbe, (dmem, hmem), over in rows:
        tbe_s = f"{tbe * 1e3:.2f}" if tbe else "n/a"
        ratio = f"{t / tbe:.2f}" if tbe else ""
        print(
            f"| {label} | {pf} | {t * 1e3:.2f} | {tbe_s} | {ratio} | {t / t_device:.2f} | "
            f"{dmem / 2**30:.2f} | {hmem / 2**30:.2f} | {over} |"
        )


if __name__ == "__main__":
    main()
