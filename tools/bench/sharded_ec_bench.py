"""Train-step time of a sharded EmbeddingCollection: dynamicemb against TorchRec.

    python tools/bench/sharded_ec_bench.py [--device cuda|cpu] [--world-size W]
        [--batch 65536] [--features 26] [--hotness 10] [--dim 128]
        [--rows 10000000] [--optimizer adam|sgd|rowwise_adagrad] [--dedup]
        [--warmup 5] [--steps 20]

One EmbeddingCollection with one table looked up by every feature, sharded
over every rank by DistributedModelParallel (one process per GPU with NCCL, or
CPU processes with gloo), in two versions in the same run:

* dynamicemb: the table is a dynamic table, planned by
  DynamicEmbeddingShardingPlanner (row-wise, dist_type roundrobin) and sharded
  by DynamicEmbeddingCollectionSharder;
* TorchRec: the same table as a TorchRec table of ``rows`` rows, planned by
  TorchRec's EmbeddingShardingPlanner constrained to row-wise and the FUSED
  kernel (FBGEMM's TBE) and sharded by EmbeddingCollectionSharder.

``--batch`` is the global batch, split over the ranks; every sample has
``--hotness`` ids per feature, drawn from a power law (exponent ``--alpha``)
over ``[0, rows)`` and scattered by a fixed bijection (hot ids are not the
small ones). A train step is forward, backward of the sum of the outputs, and
the fused optimizer update (in the backward); each step gets fresh ids (made
before the step's clock starts). Prints the median step time after warm-up
(the slowest rank's median) of both versions as a markdown table row.
"""

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# examples/dist_launch.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import dist_launch

TABLE = "t0"
# An odd prime: id = rank * MULT mod rows is a bijection of [0, rows) unless
# MULT divides rows.
MULT = 2654435761


def feature_names(n: int) -> list[str]:
    return [f"f{i}" for i in range(n)]


def power_law(
    g: torch.Generator, n: int, rows: int, alpha: float, device: torch.device
) -> torch.Tensor:
    """n ids in [0, rows): ranks with P(r) ~ r^-alpha (continuous inverse CDF,
    floored), scattered by ``r * MULT mod rows``."""
    u = torch.rand(n, generator=g, dtype=torch.float64, device=device)
    a = 1.0 - alpha
    r = (((rows**a - 1.0) * u + 1.0) ** (1.0 / a)).long().clamp_(1, rows) - 1
    return (r * MULT) % rows


def make_batch(args, step: int, rank: int, local_batch: int, device: torch.device):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator(device=device).manual_seed(1_000_003 * step + 7919 * rank + 1)
    n = args.features * local_batch * args.hotness
    values = power_law(g, n, args.rows, args.alpha, device)
    lengths = torch.full(
        (args.features * local_batch,), args.hotness, dtype=torch.int64, device=device
    )
    return KeyedJaggedTensor(keys=feature_names(args.features), values=values, lengths=lengths)


def fused_params(args) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if args.optimizer == "adam":
        return {
            "optimizer": EmbOptimType.ADAM,
            "learning_rate": args.lr,
            "eps": 1e-8,
            "beta1": 0.9,
            "beta2": 0.999,
        }
    if args.optimizer == "rowwise_adagrad":
        return {
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": args.lr,
            "eps": 1e-8,
        }
    return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": args.lr}


class Model(torch.nn.Module):
    def __init__(self, args) -> None:
        super().__init__()
        from torchrec.modules.embedding_configs import EmbeddingConfig
        from torchrec.modules.embedding_modules import EmbeddingCollection

        self.config = EmbeddingConfig(
            name=TABLE,
            num_embeddings=args.rows,
            embedding_dim=args.dim,
            feature_names=feature_names(args.features),
        )
        self.ec = EmbeddingCollection(tables=[self.config], device=torch.device("meta"))

    def forward(self, kjt):
        return self.ec(kjt)


def topology(world_size: int, device: torch.device):
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world_size, compute_device=device.type, local_world_size=world_size)


def build_dynamicemb(args, world_size: int, device: torch.device, local_batch: int):

    from dynamicemb import DynamicEmbTableOptions, get_table_value_bytes
    from dynamicemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
    from dynamicemb.shard import DynamicEmbeddingCollectionSharder

    params = fused_params(args)
    model = Model(args)
    # The whole table's values on the devices (they are there in any case;
    # this keeps the planner's memory estimate honest).
    hbm = get_table_value_bytes(model.config, params["optimizer"], world_size, 128)
    constraints = {
        TABLE: DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                bucket_capacity=128,
                dist_type="roundrobin",
                global_hbm_for_values=hbm,
            ),
        )
    }
    sharder = DynamicEmbeddingCollectionSharder(fused_params=params, use_index_dedup=args.dedup)
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=[model.config],
        topology=topology(world_size, device),
        constraints=constraints,
        batch_size=local_batch,
        debug=False,
    )
    return dist_launch.plan_and_shard(model, planner, sharder, device)


def build_torchrec(args, world_size: int, device: torch.device, local_batch: int):
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints

    model = Model(args)
    # TorchRec's index dedup is a CUDA op (fbgemm::jagged_unique_indices).
    dedup = args.dedup and device.type == "cuda"
    sharder = EmbeddingCollectionSharder(fused_params=fused_params(args), use_index_dedup=dedup)
    planner = EmbeddingShardingPlanner(
        topology=topology(world_size, device),
        batch_size=local_batch,
        constraints={
            TABLE: ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["fused"])
        },
        debug=False,
    )
    return dist_launch.plan_and_shard(model, planner, sharder, device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(model, args, rank: int, local_batch: int, device: torch.device) -> float:
    """This rank's median train-step time in seconds."""
    times = []
    for step in range(args.warmup + args.steps):
        kjt = make_batch(args, step, rank, local_batch, device)
        _sync(device)
        dist.barrier()  # every rank starts the step together
        t0 = time.perf_counter()
        out = model(kjt)
        loss = torch.stack([out[f].values().sum() for f in feature_names(args.features)]).sum()
        loss.backward()
        _sync(device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        del out, loss
    return statistics.median(times)


def dynamic_table_stats(model) -> torch.Tensor:
    """[rows held, evictions, insert failures] of this rank's dynamic tables."""
    from dynamicemb.shard import dynamic_embedding_kernels

    held = evictions = failures = 0
    for kernel in dynamic_embedding_kernels(model):
        table = kernel.emb_module.table
        held += int(table.size().sum())
        evictions += int(table.counter("EVICTIONS").sum())
        failures += int(table.counter("INSERT_FAILURES").sum())
    return torch.tensor([held, evictions, failures], dtype=torch.int64)


def _max_over_ranks(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def run(rank: int, world_size: int, args) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    local_batch = args.batch // world_size
    lead = rank == 0
    results: dict[str, float] = {}
    notes: list[str] = []
    for which in args.which:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        build = build_dynamicemb if which == "dynamicemb" else build_torchrec
        model, plan = build(args, world_size, device, local_batch)
        ps = plan.plan["ec"][TABLE]
        built = time.perf_counter() - start
        median = time_steps(model, args, rank, local_batch, device)
        results[which] = _max_over_ranks(median, device)
        extra = ""
        if which == "dynamicemb":
            stats = dynamic_table_stats(model).to(device)
            dist.all_reduce(stats)
            held, evictions, failures = stats.tolist()
            extra = (
                f", rows held {held:,}, evictions {evictions:,}, "
                f"insert failures {failures:,} (all ranks)"
            )
        if device.type == "cuda":
            peak = _max_over_ranks(torch.cuda.max_memory_allocated(device) / 2**30, device)
            extra += f", peak memory {peak:.1f} GiB"
        line = (
            f"{which}: {type(ps).__name__} {ps.sharding_type}/{ps.compute_kernel}, built in "
            f"{built:.1f} s, "
            f"median step {1e3 * results[which]:.2f} ms{extra}"
        )
        notes.append(line)
        if lead:
            print(line, flush=True)
        del model, plan
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dist.barrier()
    if not lead:
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    ours = results.get("dynamicemb")
    theirs = results.get("torchrec")

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1e3 * x:.2f}"

    ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
    dedup = ("on" if device.type == "cuda" else "dynamicemb only") if args.dedup else "off"
    print()
    print("`" + " ".join(["python", "tools/bench/sharded_ec_bench.py"] + sys.argv[1:]) + "`")
    print()
    print(
        "| world | device | global batch | features | hotness | dim | rows | optimizer | dedup "
        "| dynamicemb ms/step | TorchRec ms/step | dynamicemb / TorchRec |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {world_size} | {name} | {args.batch:,} | {args.features} | {args.hotness} | {args.dim} "
        f"| {args.rows:,} | {args.optimizer} | {dedup} "
        f"| {ms(ours)} | {ms(theirs)} | {ratio} |",
        flush=True,
    )


def _quiet() -> None:
    import logging
    import warnings

    for name in (
        "torchrec.sparse.jagged_tensor_validator",
        "torch.fx._symbolic_trace",
        "torchrec.distributed.planner.types",
        "torchrec.distributed.planner.storage_reservations",
        "torchrec.distributed.planner.planners",
        "torchrec.distributed.planner.stats",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def _worker(rank: int, world_size: int, port: int, args) -> None:
    _quiet()
    dist_launch.init_process_group(rank, world_size, port, args.device, args.threads)
    try:
        run(rank, world_size, args)
    finally:
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None):
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    dist_launch.add_device_args(ap, has_gpu)
    ap.add_argument("--batch", type=int, default=65536, help="global batch, split over the ranks")
    ap.add_argument("--features", type=int, default=26)
    ap.add_argument("--hotness", type=int, default=10, help="ids per feature and sample")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument(
        "--rows", type=int, default=10_000_000, help="id space and TorchRec's table rows"
    )
    ap.add_argument("--alpha", type=float, default=1.05, help="power-law exponent of the ids")
    ap.add_argument(
        "--optimizer",
        choices=["adam", "sgd", "rowwise_adagrad"],
        default="adam",
        help="fused optimizer (FBGEMM's CPU kernel has no adam: use sgd on cpu)",
    )
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--dedup",
        action="store_true",
        help="index dedup in both sharders (TorchRec's: on cuda only, its op has no CPU kernel)",
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument(
        "--which",
        nargs="+",
        choices=["torchrec", "dynamicemb"],
        default=["torchrec", "dynamicemb"],
        help="versions to time, in this order",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads per CPU process")
    args = ap.parse_args(argv)
    dist_launch.check_device_args(ap, args, has_gpu)
    if args.batch % args.world_size:
        ap.error(f"--batch {args.batch} is not a multiple of the world size {args.world_size}")
    if args.rows % MULT == 0:
        ap.error(f"--rows must not be a multiple of {MULT}")
    if (
        min(args.batch, args.features, args.hotness, args.dim, args.rows, args.steps) < 1
        or args.warmup < 0
    ):
        ap.error("sizes and --steps must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"sharded EmbeddingCollection, {args.world_size} {args.device} rank(s): global batch "
        f"{args.batch:,}, "
        f"{args.features} features x hotness {args.hotness} on one table of dim {args.dim}, ids "
        "power law "
        f"alpha {args.alpha} over {args.rows:,}, {args.optimizer}, "
        f"dedup {'on' if args.dedup else 'off'}, "
        f"{args.warmup} warm-up + {args.steps} timed steps",
        flush=True,
    )
    mp.spawn(
        _worker,
        args=(args.world_size, dist_launch.free_port(), args),
        nprocs=args.world_size,
        join=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
