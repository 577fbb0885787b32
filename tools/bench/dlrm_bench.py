"""Examples per second of the main job's model with dynamic tables and with
TorchRec's static tables, in one run: the figure a team reads first.

    python tools/bench/dlrm_bench.py [--warmup 5] [--steps 20] [--rounds 3] [--json FILE]
        [the job's options: --preset criteo --interaction dcn --device cuda ...]

Builds the model of examples/train_dlrm.py twice with the job's own builder
(``train_dlrm.build``), from the options the job takes (any option this
script does not know is the job's, checked as the job checks it; e.g.
``--preset criteo``, the shape of TorchRec's DLRM examples,
examples/criteo_preset.py):

* ``dynamic``: the job as it runs, its tables dynamic (planned by
  DynamicEmbeddingShardingPlanner, sharded by dynamicemb's sharder), fed the
  raw ids;
* ``static``: the same model with TorchRec's own tables of the same rows,
  planned by TorchRec's planner (the FUSED kernel) and sharded by its
  EmbeddingBagCollectionSharder, fed each id modulo its table's rows
  (``static_batch``), as a static table must be.

Both train with the job's step (``train_dlrm.train_step``: forward, the loss,
backward with the tables' fused optimizer, the dense optimizer's step) on the
same generated batches, every step of each on a batch it has not seen (a
batch seen twice finds its ids in the dynamic tables and hides the insert
path): ``--warmup`` steps each, then ``--rounds`` rounds of ``--steps``
steps, the two models taking turns round by round (the order rotates) so
that drift in the machine's speed weighs on both alike. The batches are made
and moved to the device before the clock starts; a round's steps are issued
back to back with one synchronization at the end (as the job's loop runs).
Prints each model's examples per second (all ranks; the median round, the
slowest rank's time) and ms per step, and the dynamic model's over the
static one's.
"""

import argparse
import dataclasses
import hashlib
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

# examples/: the job's modules, as they import each other.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import dist_launch
import train_dlrm
import train_report

MODELS = ("dynamic", "static")


def static_shard(args):
    """How ``train_dlrm.build`` shards the ``static`` model: TorchRec's own
    tables of the same rows, planned by its planner (any sharding with the
    FUSED kernel, the rows updated by the fused optimizer as the dynamic ones
    are) over the device's whole memory, sharded by its
    EmbeddingBagCollectionSharder through DistributedModelParallel."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingEnv, ShardingType

    from dynamicemb.planner import topology

    def shard(model, env: dist_launch.RankEnv, device: torch.device):
        sharder = EmbeddingBagCollectionSharder(fused_params=train_dlrm.fused_params(args))
        where = topology(
            world_size=env.world_size,
            compute_device=device.type,
            local_world_size=env.local_world_size,
            # TorchRec's tables take their rows from the device's memory, all of it theirs.
            hbm_cap=torch.cuda.get_device_properties(device).total_memory
            if device.type == "cuda"
            else None,
        )
        # Every sharding but data parallel, which has no FUSED kernel.
        kinds = [t.value for t in ShardingType if t != ShardingType.DATA_PARALLEL]
        fused = ParameterConstraints(sharding_types=kinds, compute_kernels=["fused"])
        ebc = next(m for m in model.modules() if type(m).__name__ == "EmbeddingBagCollection")
        planner = EmbeddingShardingPlanner(
            topology=where,
            batch_size=args.batch_size,
            constraints={c.name: fused for c in ebc.embedding_bag_configs()},
            debug=False,
        )
        plan = planner.collective_plan(model, [sharder], dist.group.WORLD)
        sharded = DistributedModelParallel(
            model,
            env=ShardingEnv.from_process_group(dist.group.WORLD),
            device=device,
            plan=plan,
            sharders=[sharder],
        )
        return sharded, plan

    return shard


def static_batch(batch, features):
    """``batch`` as the static tables take it: each feature's ids modulo its
    table's rows, as a static table must."""
    counts = batch.lengths.view(len(features), -1).sum(1)
    rows = torch.repeat_interleave(
        torch.tensor([f.capacity for f in features]), counts, output_size=batch.values.numel()
    )
    return dataclasses.replace(batch, values=torch.remainder(batch.values, rows))


def fingerprint(batch, features) -> str:
    """A digest of ``batch`` as the static tables see it (its ids modulo the
    rows), the same for a batch and its ``static_batch``."""
    seen = static_batch(batch, features)
    h = hashlib.sha256()
    for t in (seen.dense, seen.labels, seen.lengths, seen.values):
        h.update(t.cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def batches(args, rank: int, world_size: int, features, device) -> list:
    """This rank's batches of the run (the job's generated data), on the
    device: ``warmup + rounds * steps`` of them, each used once by each model."""
    stream = train_dlrm.DataSource(args).train(rank, world_size, 0, None)
    n = args.warmup + args.rounds * args.steps
    out = []
    for _ in range(n):
        b = next(stream)
        out.append(
            {m: _on(b if m == "dynamic" else static_batch(b, features), device) for m in MODELS}
        )
    return out


def _on(batch, device):
    fields = {k: v.to(device) for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    return type(batch)(**fields)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _max_over_ranks(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def run(env: dist_launch.RankEnv, device: torch.device, args) -> dict | None:
    lead = env.rank == 0
    source = train_dlrm.DataSource(args)
    features = source.features
    if lead:
        print(train_report.header(args, env, source), flush=True)
    built = {}
    for m in MODELS:
        t0 = time.perf_counter()
        shard = static_shard(args) if m == "static" else None
        model, plan, dense_opt = train_dlrm.build(features, args, env, device, shard)
        built[m] = (model, dense_opt)
        shards = next(iter(plan.plan.values())).values()  # the collection's tables
        kinds = sorted({f"{ps.sharding_type}/{ps.compute_kernel}" for ps in shards})
        if lead:
            print(f"{m}: {', '.join(kinds)}, built in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    data = batches(args, env.rank, env.world_size, features, device)
    if lead:
        print(f"{len(data)} batches made in {time.perf_counter() - t0:.1f} s", flush=True)

    used: dict[str, list[int]] = {m: [] for m in MODELS}  # each model's batches, in order

    def steps(m: str, first: int, n: int) -> float:
        """Seconds for ``n`` steps of model ``m`` on batches first.., issued
        back to back (the slowest rank's)."""
        model, dense_opt = built[m]
        used[m].extend(range(first, first + n))
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        for b in data[first : first + n]:
            train_dlrm.train_step(model, dense_opt, b[m], features, device)
        _sync(device)
        return _max_over_ranks(time.perf_counter() - start, device)

    for m in MODELS:
        steps(m, 0, args.warmup)
    seconds = {m: [] for m in MODELS}
    for r in range(args.rounds):
        order = MODELS[r % 2 :] + MODELS[: r % 2]
        for m in order:
            seconds[m].append(steps(m, args.warmup + r * args.steps, args.steps))
    examples = args.batch_size * env.world_size * args.steps
    result = {
        m: {
            "examples_per_s": examples / statistics.median(seconds[m]),
            "ms_per_step": 1e3 * statistics.median(seconds[m]) / args.steps,
            "round_seconds": seconds[m],
        }
        for m in MODELS
    }
    # What each model trained on, for a check that both saw the same batches.
    for m in MODELS:
        result[m]["batches"] = [fingerprint(data[i][m], features) for i in used[m]]
    same = result["dynamic"]["batches"] == result["static"]["batches"]
    stats = train_report.table_stats(built["dynamic"][0])
    local = torch.tensor([stats[n] for n in sorted(stats)], dtype=torch.int64).sum(0).to(device)
    dist.all_reduce(local)
    if device.type == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    if not lead:
        return None
    held, capacity, evictions, failures, inserts, *_ = local.tolist()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print()
    print("`" + " ".join(["python", "tools/bench/dlrm_bench.py"] + sys.argv[1:]) + "`")
    print()
    print(
        f"{env.world_size} x {name}, {len(features)} tables ({sum(f.capacity for f in features):,} "
        f"rows), dim {args.dim}, batch {args.batch_size:,} per rank, {args.emb_optimizer}, "
        f"{args.warmup} warm-up steps, {args.rounds} rounds of {args.steps} steps"
    )
    print()
    print("| model | tables | examples/s | ms/step |")
    print("|---|---|---|---|")
    for m, tables in zip(MODELS, ("dynamicemb", "TorchRec (FUSED)"), strict=True):
        r = result[m]
        print(f"| {m} | {tables} | {r['examples_per_s']:,.0f} | {r['ms_per_step']:.2f} |")
    ratio = result["dynamic"]["examples_per_s"] / result["static"]["examples_per_s"]
    print()
    print(
        f"dynamic / static examples/s: {ratio:.3f} (dynamic tables: {held:,} rows held of "
        f"{capacity:,}, {inserts:,} inserts, {evictions:,} evictions, {failures:,} insert "
        "failures, all ranks)"
    )
    distinct = len(set(result["dynamic"]["batches"]))
    print(
        f"both models trained on the same {len(used['dynamic'])} batches in the same order: "
        f"{'yes' if same else 'NO'}; {distinct} distinct"
    )
    result.update(ratio=ratio, same_batches=same, world_size=env.world_size, device=name)
    result["args"] = vars(args)
    result["dynamic_tables"] = {
        "rows_held": held,
        "capacity": capacity,
        "inserts": inserts,
        "evictions": evictions,
        "insert_failures": failures,
    }
    return result


def parse_args(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps of each model")
    ap.add_argument("--steps", type=int, default=20, help="steps of a timed round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each model")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ours, rest = ap.parse_known_args(argv)
    if min(ours.steps, ours.rounds) < 1 or ours.warmup < 0:
        ap.error("--steps and --rounds must be positive, --warmup not negative")
    args = train_dlrm.parse_args(rest)  # the job's options, checked as the job checks them
    if args.emb_optimizer == "rowwise_rmsprop_ar":
        ap.error(
            "--emb-optimizer rowwise_rmsprop_ar: TorchRec's static tables have no kernel for it, "
            "so the two models would train differently"
        )
    for k, v in vars(ours).items():
        setattr(args, k, v)
    return args


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    args = parse_args(argv)
    return dist_launch.run_job(run, args, args.json)


if __name__ == "__main__":
    sys.exit(main())
