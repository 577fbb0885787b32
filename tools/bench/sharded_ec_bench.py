"""Train-step time of a sharded embedding collection: dynamicemb against TorchRec's plans.

    python tools/bench/sharded_ec_bench.py [--device cuda|cpu] [--world-size W]
        [--collection ec|ebc] [--batch 65536] [--tables 1] [--features 26]
        [--hotness 10] [--dim 128] [--rows 10000000] [--id-space N]
        [--optimizer adam [sgd ...]] [--plans planner table_wise row_wise]
        [--mc mch zch] [--mch-policy distance_lfu|lru] [--dedup]
        [--warmup 5] [--steps 20] [--profile-steps 0] [--json FILE]

An EmbeddingCollection (``--collection ec``, sequence lookups) or an
EmbeddingBagCollection (``ebc``, SUM pooling) of ``--tables`` tables
(``--features`` features in all, split evenly, each table looked up by its
own), sharded over every rank by DistributedModelParallel (one process per
GPU with NCCL, or CPU processes with gloo), in several versions in the same
run, on the same batches:

* dynamicemb: dynamic tables planned by DynamicEmbeddingShardingPlanner
  (row-wise, dist_type roundrobin) with every row in device memory
  (``global_hbm_for_values`` = the tables' value bytes), sharded by
  DynamicEmbeddingCollectionSharder / DynamicEmbeddingBagCollectionSharder;
* TorchRec, one version per ``--plans`` entry: the same tables as TorchRec
  tables of ``rows`` rows, planned by TorchRec's EmbeddingShardingPlanner and
  sharded by TorchRec's own sharder: ``planner`` with no constraints at all
  (what a user who leaves the choice to TorchRec gets), ``table_wise`` and
  ``row_wise`` constrained to that sharding type and the FUSED kernel
  (FBGEMM's TBE). The plan each got is printed;
* TorchRec's managed-collision tables, one version per ``--mc`` entry
  (tools/bench/sharded_mc.py: ``mch``, MCHManagedCollisionModule with its
  eviction policy, ``--mch-policy``, merging new ids every
  ``--mc-eviction-interval`` steps; ``zch``, HashZchManagedCollisionModule
  with LRU eviction), ``rows`` rows per table as the dynamic tables, sharded
  row-wise by ManagedCollisionEmbeddingCollectionSharder (or its EBC twin).
  A kind this machine's TorchRec or FBGEMM cannot train is a row "n/a" with
  the reason.

``--batch`` is the global batch, split over the ranks; every sample has
``--hotness`` ids per feature, drawn from a power law (exponent ``--alpha``)
over ``[0, id_space)`` (``--id-space``, default ``rows``) and scattered by a
fixed bijection (hot ids are not the small ones). Where the ids range beyond
the rows, the dynamic and managed-collision tables take them raw and evict,
and TorchRec's static tables take them modulo their rows (before the clock
starts, as the batch is made). A train step is forward, backward of the sum
of the outputs, and the fused optimizer update (in the backward). Every
step of every version gets a batch it has not seen (a batch seen twice
would find all its ids in the table and hide the insert path): the warm-up,
timed, pipelined and profiled steps each draw new ones, all made before the
step's clock starts, and the versions train on the same batches in turn.
All versions are built first and then take
turns step by step, so that drift in the machine's speed during the run
weighs on all alike. For each version: the median step time after warm-up
with a synchronization after every step (the slowest rank's median), the
median host time (until the step is issued, without waiting for the device),
and the pipelined step time (``--steps`` steps issued back to back, one
synchronization at the end: what a training loop that never waits sees, the
larger of the host's and the device's time). For each optimizer a markdown
table gives every version's times and the ratio of dynamicemb's to each
TorchRec version's; below it the ratio to the faster of TorchRec's planner
and table_wise (what a user with bounded ids picks) and to the faster
managed-collision version (with unbounded ids), with the HBM floor: the
bytes a step must move on a rank (its keys in, its outputs out and their
gradients in, each distinct row and its optimizer state read and written
once) over the device's copy bandwidth measured in the run.

``--profile-steps N`` (CUDA) profiles N more steps of each version with
torch.profiler and prints, per step, the device time of each stage (input
distribution, routing, a managed-collision module's remap (and eviction),
de-duplication, unique, find-or-insert, the lookup
replayed from a CUDA graph (unique and find-or-insert in one), pooling,
output distribution, backward, update; kernels attributed by the range their
launch falls in: dynamicemb's ``dynamicemb:*`` ranges, and the benchmark's
own around the sharded module's input dist, lookups, output dists, the
output wait and the backward; TorchRec's TBE kernels by name), the host time
(until the step is issued, without waiting for the device), kernel launches,
host-device copies and synchronizations (also counted with
``torch.cuda.set_sync_debug_mode("warn")``).
"""

import argparse
import collections
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import record_function

# examples/dist_launch.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import dist_launch
import sharded_mc  # tools/bench/sharded_mc.py, next to this script

# An odd prime: id = rank * MULT mod rows is a bijection of [0, rows) unless
# MULT divides rows.
MULT = 2654435761

# The stages of a step, in the order they are printed.
STAGES = [
    "input_dist",
    "routing",
    "remap",
    "dedup",
    "unique",
    "find_or_insert",
    "lookup_graph",
    "pooling",
    "lookup_other",
    "output_dist",
    "backward",
    "update",
    "other",
]
# dynamicemb's ranges (dynamicemb/shard/input_dist.py, embedding/batched_tables.py).
OUR_RANGES = {
    "dynamicemb:routing": "routing",
    "dynamicemb:dedup": "dedup",
    "dynamicemb:unique": "unique",
    "dynamicemb:find_or_insert": "find_or_insert",
    "dynamicemb:lookup_graph": "lookup_graph",  # the lookup replayed from a CUDA graph
    "dynamicemb:pool": "pooling",
    "dynamicemb:update": "update",
    "## dedup_ec_indices ##": "dedup",  # TorchRec's own dedup
}
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)


def table_names(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


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


# What a batch is for: every batch a version trains on is new to it (a batch
# seen twice finds all its ids in the table and hides the insert path), so
# each phase of the run draws from seeds of its own, and no phase repeats an
# index. The versions train on the same batches (the same ids) in turn.
PHASES = {"build": 0, "timed": 1, "pipelined": 2, "profiled": 3, "sync_check": 4}
# More than the batches of any phase.
PHASE_BATCHES = 1_000_003


def make_batch(args, phase: str, index: int, rank: int, local_batch: int, device: torch.device):
    """Batch ``index`` of ``phase`` for ``rank``: ids from a power law over
    ``[0, args.id_space)``, each (phase, index, rank) drawn from its own seed."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if not 0 <= index < PHASE_BATCHES:
        raise ValueError(f"batch index {index} of phase {phase!r} is outside [0, {PHASE_BATCHES})")
    seed = (PHASES[phase] * PHASE_BATCHES + index) * 7919 + rank + 1
    g = torch.Generator(device=device).manual_seed(seed)
    n = args.features * local_batch * args.hotness
    values = power_law(g, n, args.id_space, args.alpha, device)
    lengths = torch.full(
        (args.features * local_batch,), args.hotness, dtype=torch.int64, device=device
    )
    return KeyedJaggedTensor(keys=feature_names(args.features), values=values, lengths=lengths)


def fused_params(optimizer: str, lr: float) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if optimizer == "adam":
        return {
            "optimizer": EmbOptimType.ADAM,
            "learning_rate": lr,
            "eps": 1e-8,
            "beta1": 0.9,
            "beta2": 0.999,
        }
    if optimizer == "rowwise_adagrad":
        return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr, "eps": 1e-8}
    return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr}


# The sharded collection's attribute in Model (its path in the sharding plan).
COLLECTION = "emb"

# TorchRec's plans: None leaves the choice to its planner, else the one
# sharding type allowed (with the FUSED kernel).
PLANS = {"planner": None, "table_wise": "table_wise", "row_wise": "row_wise"}
# TorchRec's static tables: ids modulo their rows.
STATIC = {f"torchrec:{p}" for p in PLANS}


def mc_kind(which: str) -> str | None:
    """The managed-collision kind of version ``which`` (``torchrec:mch``:
    mch), None for the others."""
    kind = which.partition(":")[2]
    return kind if which.startswith("torchrec:") and kind in sharded_mc.MC_KINDS else None


def version_batch(which: str, kjt, args):
    """The batch as version ``which`` takes it: TorchRec's static tables take
    the ids modulo their rows (as a static table must, when the ids range
    beyond them: ``--id-space``), the dynamic and managed-collision tables
    the raw ids."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if which not in STATIC or args.id_space <= args.rows:
        return kjt
    return KeyedJaggedTensor(
        keys=kjt.keys(), values=kjt.values() % args.rows, lengths=kjt.lengths()
    )


# The batches each version trained on, by (phase, index), for the optimizer
# being timed (run_optimizer starts it afresh with the versions it builds).
TRAINED: dict[str, set[tuple[str, int]]] = collections.defaultdict(set)


def train_batch(which: str, args, phase: str, index: int, rank: int, local_batch: int, device):
    """Batch ``index`` of ``phase`` as version ``which`` takes it
    (version_batch), made before its step's clock starts; refuses a batch the
    version trained on before."""
    if (phase, index) in TRAINED[which]:
        raise RuntimeError(
            f"{which} would train on batch {index} of phase {phase!r} twice: a batch seen "
            "twice finds its ids in the table and hides the insert path"
        )
    TRAINED[which].add((phase, index))
    return version_batch(which, make_batch(args, phase, index, rank, local_batch, device), args)


class Model(torch.nn.Module):
    """One EmbeddingCollection or (SUM) EmbeddingBagCollection, ``emb``; with
    ``mc`` (sharded_mc.MC_KINDS), behind TorchRec's managed-collision modules."""

    def __init__(self, args, mc: str | None = None, world_size: int = 1) -> None:
        super().__init__()
        from torchrec.modules.embedding_configs import (
            EmbeddingBagConfig,
            EmbeddingConfig,
            PoolingType,
        )
        from torchrec.modules.embedding_modules import (
            EmbeddingBagCollection,
            EmbeddingCollection,
        )

        per = args.features // args.tables
        features = feature_names(args.features)
        bags = args.collection == "ebc"
        config, extra = (
            (EmbeddingBagConfig, {"pooling": PoolingType.SUM})
            if bags
            else (
                EmbeddingConfig,
                {},
            )
        )
        self.configs = [
            config(
                name=name,
                num_embeddings=args.rows,
                embedding_dim=args.dim,
                feature_names=features[t * per : (t + 1) * per],
                **extra,
            )
            for t, name in enumerate(table_names(args.tables))
        ]
        collection = EmbeddingBagCollection if bags else EmbeddingCollection
        meta = torch.device("meta")
        self.emb = collection(tables=self.configs, device=meta)
        if mc is not None:
            self.emb = sharded_mc.wrap(mc, self.emb, self.configs, args, world_size, meta)

    def forward(self, kjt):
        return self.emb(kjt)


def topology(world_size: int, device: torch.device):
    from torchrec.distributed.planner import Topology

    return Topology(world_size=world_size, compute_device=device.type, local_world_size=world_size)


def build_dynamicemb(args, optimizer: str, world_size: int, device: torch.device, local_batch: int):
    from dynamicemb import DynamicEmbTableOptions, get_table_value_bytes
    from dynamicemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
    from dynamicemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
        plan_and_shard,
    )

    params = fused_params(optimizer, args.lr)
    model = Model(args)
    constraints = {}
    for config in model.configs:
        # Every row in device memory: the budget of the table's value bytes
        # (a budget of 0 would keep the rows in host memory).
        hbm = get_table_value_bytes(config, params["optimizer"], world_size, 128)
        constraints[config.name] = DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                bucket_capacity=128, dist_type="roundrobin", global_hbm_for_values=hbm
            ),
        )
    if args.collection == "ebc":
        sharder = DynamicEmbeddingBagCollectionSharder(fused_params=params)
    else:
        sharder = DynamicEmbeddingCollectionSharder(fused_params=params, use_index_dedup=args.dedup)
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=model.configs,
        topology=topology(world_size, device),
        constraints=constraints,
        batch_size=local_batch,
        debug=False,
    )
    return plan_and_shard(model, planner, [sharder], device)


def torchrec_plan_and_shard(model: torch.nn.Module, planner, sharder, device: torch.device):
    """What ``dynamicemb.shard.plan_and_shard`` does, with TorchRec's own
    planner (the baselines): the plan over the world, then
    ``DistributedModelParallel``. Returns (the sharded model, the plan)."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    plan = planner.collective_plan(model, [sharder], dist.group.WORLD)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = DistributedModelParallel(model, env=env, device=device, plan=plan, sharders=[sharder])
    return sharded, plan


def build_torchrec(
    args, optimizer: str, world_size: int, device: torch.device, local_batch: int, plan: str
):
    """TorchRec's tables, planned as ``PLANS[plan]`` says, or behind its
    managed-collision modules (``plan`` one of sharded_mc.MC_KINDS)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ParameterConstraints

    params = fused_params(optimizer, args.lr)
    if plan in sharded_mc.MC_KINDS:
        model = Model(args, mc=plan, world_size=world_size)
        planner = EmbeddingShardingPlanner(
            topology=topology(world_size, device),
            batch_size=local_batch,
            constraints=sharded_mc.constraints(model.configs),
            debug=False,
        )
        return torchrec_plan_and_shard(
            model, planner, sharded_mc.sharder(args.collection, params), device
        )
    model = Model(args)
    if args.collection == "ebc":
        sharder = EmbeddingBagCollectionSharder(fused_params=params)
    else:
        # TorchRec's index dedup is a CUDA op (fbgemm::jagged_unique_indices).
        dedup = args.dedup and device.type == "cuda"
        sharder = EmbeddingCollectionSharder(fused_params=params, use_index_dedup=dedup)
    sharding = PLANS[plan]
    constraints = None
    if sharding is not None:
        constraints = {
            c.name: ParameterConstraints(sharding_types=[sharding], compute_kernels=["fused"])
            for c in model.configs
        }
    planner = EmbeddingShardingPlanner(
        topology=topology(world_size, device),
        batch_size=local_batch,
        constraints=constraints,
        debug=False,
    )
    return torchrec_plan_and_shard(model, planner, sharder, device)


def build(which: str, args, optimizer: str, world_size: int, device, local_batch: int):
    """A version by its name: ``dynamicemb``, ``dynamicemb:eager`` (no CUDA
    graphs of the lookup), ``torchrec:<plan>`` or ``torchrec:<mc kind>``."""
    if which.startswith("dynamicemb"):
        from dynamicemb.shard import dynamic_embedding_kernels

        model, plan = build_dynamicemb(args, optimizer, world_size, device, local_batch)
        for kernel in dynamic_embedding_kernels(model):
            kernel.emb_module.cuda_graphs = which == "dynamicemb"
        return model, plan
    return build_torchrec(args, optimizer, world_size, device, local_batch, which.split(":", 1)[1])


def plan_summary(plan) -> str:
    """The sharding types and compute kernels a plan gave the tables, with
    how many tables got each (``3 x table_wise/fused, ...``)."""
    per_table = plan.plan[COLLECTION]
    kinds = collections.Counter(
        f"{ps.sharding_type}/{ps.compute_kernel}" for ps in per_table.values()
    )
    return ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, kjt, args) -> None:
    """Forward, the loss (which waits for the output dist), backward."""
    out = model(kjt)
    if isinstance(out, tuple):  # a sharded managed-collision collection: (out, remapped ids)
        out = out[0]
    with record_function("bench:output_wait"):
        if args.collection == "ebc":  # a KeyedTensor
            loss = out.values().sum()
        else:  # JaggedTensors by feature
            loss = torch.stack([out[f].values().sum() for f in feature_names(args.features)]).sum()
    with record_function("bench:backward"):
        loss.backward()


def time_steps(
    models: dict[str, Any], args, rank: int, local_batch: int, device
) -> dict[str, tuple[float, float]]:
    """Per version, this rank's median train-step time and median host time
    (until the step is issued), in seconds. The versions take turns step by
    step (each step's batch made afresh for each, the same ids; the order
    rotates), so a machine that slows down or speeds up during the run
    weighs on all alike."""
    names = list(models)
    times: dict[str, list[float]] = {w: [] for w in names}
    issued: dict[str, list[float]] = {w: [] for w in names}
    for step in range(args.warmup + args.steps):
        shift = step % len(names)
        for which in names[shift:] + names[:shift]:
            kjt = train_batch(which, args, "timed", step, rank, local_batch, device)
            _sync(device)
            dist.barrier()  # every rank starts the step together
            t0 = time.perf_counter()
            train_step(models[which], kjt, args)
            t1 = time.perf_counter()
            _sync(device)
            if step >= args.warmup:
                times[which].append(time.perf_counter() - t0)
                issued[which].append(t1 - t0)
    return {w: (statistics.median(times[w]), statistics.median(issued[w])) for w in names}


def time_pipelined(
    models: dict[str, Any], args, rank: int, local_batch: int, device, rounds: int = 3
) -> dict[str, float]:
    """Per version, seconds per step of ``args.steps`` steps issued back to
    back with one synchronization at the end (the round's batches made
    before, new ones each round), the median of ``rounds`` rounds; the
    versions take turns round by round, on the same batches."""
    names = list(models)
    per_step: dict[str, list[float]] = {w: [] for w in names}
    for r in range(rounds):
        shift = r % len(names)
        for which in names[shift:] + names[:shift]:
            inputs = [
                train_batch(which, args, "pipelined", r * args.steps + s, rank, local_batch, device)
                for s in range(args.steps)
            ]
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            for kjt in inputs:
                train_step(models[which], kjt, args)
            _sync(device)
            per_step[which].append((time.perf_counter() - t0) / len(inputs))
    return {w: statistics.median(per_step[w]) for w in names}


# ------------------------------------------------------------- profiling --


def _ranged(fn, name: str):
    def run(*a, **kw):
        with record_function(name):
            return fn(*a, **kw)

    return run


def instrument(model) -> None:
    """Ranges around the sharded collections' input dist (with its waits),
    lookups and output dists (the same for both versions)."""
    from torchrec.distributed.model_parallel import get_unwrapped_module
    from torchrec.distributed.types import ShardedModule

    for m in get_unwrapped_module(model).modules():
        if not isinstance(m, ShardedModule):
            continue

        def forward(*inputs, _m=m, **kwargs):
            # ShardedModule.forward, with ranges.
            ctx = _m.create_context()
            with record_function("bench:input_dist"):
                dist_input = _m.input_dist(ctx, *inputs, **kwargs).wait().wait()
            return _m.compute_and_output_dist(ctx, dist_input)

        m.forward = forward
        for lookup in getattr(m, "_lookups", []):
            lookup.forward = _ranged(lookup.forward, "bench:lookup")
        for odist in getattr(m, "_output_dists", []):
            odist.forward = _ranged(odist.forward, "bench:output_dist")


def _stage_of(kernel: str, ranges: list[str]) -> str:
    """The stage of a device event launched inside ``ranges`` (innermost
    first)."""
    for r in ranges:
        if r in OUR_RANGES:
            return OUR_RANGES[r]
    outer = [r for r in ranges if r.startswith("bench:")]
    if sharded_mc.MC_RANGE in ranges and not (outer and outer[0] == "bench:lookup"):
        return "remap"  # a managed-collision module's (its lookup's inside is the table's)
    where = outer[0] if outer else ""
    name = kernel.lower()
    if where == "bench:input_dist":
        return "routing" if "bucketize" in name else "input_dist"
    if where == "bench:lookup":
        # TBE's forward (the fused kernel: find and pool in one).
        return "pooling" if "embedding" in name and "forward" in name else "lookup_other"
    if where in ("bench:output_dist", "bench:output_wait"):
        return "output_dist"
    if where == "bench:backward":
        return "update" if "embedding" in name and "backward" in name else "backward"
    return "other"


def analyze_trace(path: str, steps: int) -> dict[str, Any]:
    """Per step: device time of each stage (ms), kernels, copies by kind,
    synchronizing calls; from a chrome trace of ``steps`` steps."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ranges = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("cat") == "user_annotation"
    )
    launches = {}
    syncs = 0
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                launches[corr] = e["ts"]
            if e["name"] in SYNC_CALLS:
                syncs += 1
    stage_us: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    busy = 0.0
    for e in events:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        busy += e["dur"]
        if cat == "kernel":
            counts["kernels"] += 1
        elif cat == "gpu_memcpy":
            kind = "HtoD" if "HtoD" in e["name"] else "DtoH" if "DtoH" in e["name"] else "DtoD"
            counts[f"copies {kind}"] += 1
        else:
            counts["memsets"] += 1
        t = launches.get(e.get("args", {}).get("correlation"))
        inside = [] if t is None else [r for r in ranges if r[0] <= t <= r[1]]
        inside.sort(key=lambda r: r[1] - r[0])  # innermost first
        stage_us[_stage_of(e["name"], [r[2] for r in inside])] += e["dur"]
    # Host time in each range (the profiler's own cost included).
    host_us: dict[str, float] = collections.defaultdict(float)
    for start, end, name in ranges:
        if name in OUR_RANGES or name.startswith("bench:") or name == sharded_mc.MC_RANGE:
            host_us[name] += end - start
    return {
        "stages_ms": {s: stage_us.get(s, 0.0) / 1e3 / steps for s in STAGES},
        "host_ranges_ms": {k: v / 1e3 / steps for k, v in sorted(host_us.items())},
        "device_busy_ms": busy / 1e3 / steps,
        "counts": {k: v / steps for k, v in sorted(counts.items())},
        "sync_calls": syncs / steps,
    }


def profile_steps(
    which: str, model, args, rank: int, local_batch: int, device, trace_name: str
) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    n = args.profile_steps
    batches = [
        train_batch(which, args, "profiled", s, rank, local_batch, device) for s in range(n + 1)
    ]
    train_step(model, batches[0], args)  # after the instrumenting, once unprofiled
    _sync(device)
    with profile(activities=activities) as prof:
        for kjt in batches[1:]:
            train_step(model, kjt, args)
        _sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        result = analyze_trace(path, n)
        if args.trace_dir:
            name = f"{trace_name}_rank{rank}.json"
            shutil.copy(path, os.path.join(args.trace_dir, name))
    if device.type != "cuda":
        return result
    # Synchronizations of one step as torch counts them.
    kjt = train_batch(which, args, "sync_check", 0, rank, local_batch, device)
    _sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(model, kjt, args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # Per call (the mode's one-time prototype notice is not one).
    result["sync_debug_warnings"] = sum(
        "called a synchronizing CUDA operation" in str(w.message) for w in caught
    )
    return result


# ------------------------------------------------------------- the floor --


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a device-to-device copy (read + write)."""
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    _sync(device)
    return 5 * 2 * x.numel() * 4 / (time.perf_counter() - t0)


def floor_bytes(args, optimizer: str, rank: int, local_batch: int, device) -> float:
    """Bytes a step must move on this rank: its keys in, outputs out and
    their gradients in, each distinct (table, key) of its batch read and
    written with its optimizer state (the keys a rank owns are about its
    batch's share of the global batch)."""
    from dynamicemb.dynamicemb_config import value_row_bytes

    params = fused_params(optimizer, args.lr)
    row = value_row_bytes(params["optimizer"], args.dim, torch.float32)
    distinct = []
    for step in range(args.warmup, args.warmup + min(args.steps, 3)):
        kjt = make_batch(args, "timed", step, rank, local_batch, device)
        values = kjt.values().view(args.tables, -1)  # features of a table are adjacent
        distinct.append(sum(int(torch.unique(v).numel()) for v in values))
    n = local_batch * args.features * args.hotness
    # Sequence lookups give a row per id, pooled ones a row per bag.
    outputs = n if args.collection == "ec" else local_batch * args.features
    return n * 8 + 2 * outputs * args.dim * 4 + statistics.mean(distinct) * row * 2


# ------------------------------------------------------------------- run --


def dynamic_table_stats(model) -> torch.Tensor:
    """[rows held, evictions, insert failures] of this rank's dynamic tables."""
    from dynamicemb.shard import dynamic_embedding_kernels

    held = evictions = failures = 0
    for kernel in dynamic_embedding_kernels(model):
        table = kernel.emb_module.rows.hash_table
        held += int(table.size().sum())
        evictions += int(table.counter("EVICTIONS").sum())
        failures += int(table.counter("INSERT_FAILURES").sum())
    return torch.tensor([held, evictions, failures], dtype=torch.int64)


def _max_over_ranks(x: float, device: torch.device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def run_optimizer(args, optimizer: str, rank: int, world_size: int, device) -> list[dict]:
    """Every version (args.which) with ``optimizer``: built one after the
    other, each taking one step (its peak memory: above what was allocated
    before it was built), then timed in turns (time_steps, time_pipelined),
    then, each on its own, their statistics and profiles."""
    local_batch = args.batch // world_size
    models: dict[str, Any] = {}
    results: dict[str, dict[str, Any]] = {}
    TRAINED.clear()
    for which in args.which:
        kind = mc_kind(which)
        if kind is not None:
            why = sharded_mc.unavailable(kind, args.collection, device.type, world_size, args.rows)
            if why is not None:
                results[which] = {"which": which, "optimizer": optimizer, "skipped": why}
                continue
        before = _allocated(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        try:
            model, plan = build(which, args, optimizer, world_size, device, local_batch)
            kjt = train_batch(which, args, "build", 0, rank, local_batch, device)
            train_step(model, kjt, args)
            _sync(device)
        except torch.OutOfMemoryError:
            # The versions built before hold their tables (one GPU: no rank waits).
            model = plan = None
            gc.collect()
            torch.cuda.empty_cache()
            skipped = "out of device memory"
            results[which] = {"which": which, "optimizer": optimizer, "skipped": skipped}
            continue
        results[which] = {
            "which": which,
            "optimizer": optimizer,
            "plan": plan_summary(plan),
            "built_s": time.perf_counter() - start,
        }
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) - before
            results[which]["peak_gib"] = _max_over_ranks(peak / 2**30, device)
        models[which] = model
    for which, (median, issued) in time_steps(models, args, rank, local_batch, device).items():
        results[which]["step_ms"] = 1e3 * _max_over_ranks(median, device)
        results[which]["host_ms"] = 1e3 * _max_over_ranks(issued, device)
    for which, per_step in time_pipelined(models, args, rank, local_batch, device).items():
        results[which]["pipelined_ms"] = 1e3 * _max_over_ranks(per_step, device)
    for which, model in models.items():
        res = results[which]
        if which.startswith("dynamicemb"):
            stats = dynamic_table_stats(model).to(device)
            dist.all_reduce(stats)
            res["rows_held"], res["evictions"], res["insert_failures"] = stats.tolist()
        elif mc_kind(which) is not None:
            held = torch.tensor([sharded_mc.rows_held(model)], dtype=torch.int64, device=device)
            dist.all_reduce(held)
            res["rows_held"] = int(held)
        if args.profile_steps:
            instrument(model)
            res["profile"] = profile_steps(
                which,
                model,
                args,
                rank,
                local_batch,
                device,
                f"{which.replace(':', '_')}_{optimizer}",
            )
    for which in models:
        results[which]["batches"] = len(TRAINED[which])  # each a new one (train_batch)
    del models, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dist.barrier()
    return [results[w] for w in args.which if w in results]


def _line(r: dict) -> str:
    if "skipped" in r:
        return f"{r['which']}: {r['optimizer']}, skipped: {r['skipped']}"
    extra = ""
    if "evictions" in r:
        extra = (
            f", rows held {r['rows_held']:,}, evictions {r['evictions']:,}, "
            f"insert failures {r['insert_failures']:,} (all ranks)"
        )
    elif "rows_held" in r:
        extra = f", ids held {r['rows_held']:,} (all ranks)"
    if "peak_gib" in r:
        extra += f", peak memory {r['peak_gib']:.1f} GiB"
    extra += f", {r['batches']} batches, each new to it"
    return (
        f"{r['which']}: {r['optimizer']}, {r['plan']}, built in {r['built_s']:.1f} s, "
        f"median step {r['step_ms']:.2f} ms (host {r['host_ms']:.2f} ms), pipelined "
        f"{r['pipelined_ms']:.2f} ms/step{extra}"
    )


def _profile_table(results: list[dict]) -> list[str]:
    rows = [r for r in results if "profile" in r]
    if not rows:
        return []
    head = ["version", "optimizer"] + STAGES + ["device busy", "host", "step"]
    out = [
        "Per step (ms; kernels attributed by the range their launch falls in):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        p = r["profile"]
        cells = [r["which"], r["optimizer"]] + [f"{p['stages_ms'][s]:.3f}" for s in STAGES]
        cells += [f"{p['device_busy_ms']:.3f}", f"{r['host_ms']:.2f}", f"{r['step_ms']:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Host time per range (ms per step, under the profiler):", ""]
    for r in rows:
        ranges = ", ".join(f"{k} {v:.3f}" for k, v in r["profile"]["host_ranges_ms"].items())
        out.append(f"* {r['which']} {r['optimizer']}: {ranges}")
    out += [
        "",
        "| version | optimizer | kernels | copies and memsets | sync calls | sync debug warnings |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["profile"]
        copies = ", ".join(f"{k} {v:g}" for k, v in p["counts"].items() if k != "kernels")
        out.append(
            f"| {r['which']} | {r['optimizer']} | {p['counts'].get('kernels', 0):g} | "
            f"{copies or '-'} | {p['sync_calls']:g} | {p.get('sync_debug_warnings', '-')} |"
        )
    return out


def run(rank: int, world_size: int, args) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    local_batch = args.batch // world_size
    lead = rank == 0
    results: list[dict] = []
    floors: dict[str, float] = {}
    bw = copy_bandwidth(device) if device.type == "cuda" else None
    for optimizer in args.optimizer:
        if bw is not None:
            floors[optimizer] = floor_bytes(args, optimizer, rank, local_batch, device) / bw
        for r in run_optimizer(args, optimizer, rank, world_size, device):
            results.append(r)
            if lead:
                print(_line(r), flush=True)
    if not lead:
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dedup = ("on" if device.type == "cuda" else "dynamicemb only") if args.dedup else "off"
    print()
    print("`" + " ".join(["python", "tools/bench/sharded_ec_bench.py"] + sys.argv[1:]) + "`")
    print()
    print(
        f"{world_size} x {name}, {args.collection.upper()}, global batch {args.batch:,}, "
        f"{args.tables} tables, {args.features} features, hotness {args.hotness}, dim {args.dim}, "
        f"{args.rows:,} rows, ids over {args.id_space:,}, dedup {dedup}"
    )
    print()
    print(
        "| optimizer | version | plan | step ms | host ms | pipelined ms/step "
        "| dynamicemb / this (step) | dynamicemb / this (pipelined) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for optimizer in args.optimizer:
        rows = [r for r in results if r["optimizer"] == optimizer]
        ours = next((r for r in rows if r["which"] == "dynamicemb" and "skipped" not in r), None)
        for r in rows:
            if "skipped" in r:
                print(f"| {optimizer} | {r['which']} | n/a ({r['skipped']}) | | | | | |")
                continue
            ratios = ["-", "-"]
            if ours is not None and r is not ours:
                ratios = [f"{ours[k] / r[k]:.2f}" for k in ("step_ms", "pipelined_ms")]
            print(
                f"| {optimizer} | {r['which']} | {r['plan']} | {r['step_ms']:.2f} "
                f"| {r['host_ms']:.2f} | {r['pipelined_ms']:.2f} | {ratios[0]} | {ratios[1]} |",
                flush=True,
            )
        fl = floors.get(optimizer)
        entry = {"optimizer": optimizer, "floor_ms": None if fl is None else 1e3 * fl}
        ran = [r for r in rows if "skipped" not in r]
        # What a user would pick: the faster of TorchRec's own plan and table_wise
        # (ids bounded), or of its managed-collision tables (ids unbounded).
        picks = {
            "best": [r for r in ran if r["which"] in ("torchrec:planner", "torchrec:table_wise")],
            "best_mc": [r for r in ran if mc_kind(r["which"]) is not None],
        }
        for pick, best in picks.items():
            if ours is None or not best:
                continue
            for k in ("step_ms", "pipelined_ms"):
                fastest = min(best, key=lambda r, k=k: r[k])
                entry[f"{pick}_{k}"] = {"version": fastest["which"], "ratio": ours[k] / fastest[k]}
        summary.append(entry)
    print()
    for entry in summary:
        line = f"* {entry['optimizer']}:"
        for pick in ("best", "best_mc"):
            for k, what in (("step_ms", "step"), ("pipelined_ms", "pipelined")):
                if f"{pick}_{k}" in entry:
                    b = entry[f"{pick}_{k}"]
                    line += f" dynamicemb / {b['version']} {b['ratio']:.2f} ({what});"
        if entry["floor_ms"] is not None:
            line += f" HBM floor {entry['floor_ms']:.2f} ms"
        print(line.rstrip(";"), flush=True)
    for line in _profile_table(results):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "world_size": world_size,
                    "device": name,
                    "args": vars(args),
                    "results": results,
                    "floors_ms": {k: 1e3 * v for k, v in floors.items()},
                    "summary": summary,
                },
                f,
                indent=1,
            )


def _quiet() -> None:
    import logging

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
    ap.add_argument("--tables", type=int, default=1, help="tables; --features are split evenly")
    ap.add_argument("--features", type=int, default=26, help="features of all tables")
    ap.add_argument("--hotness", type=int, default=10, help="ids per feature and sample")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument(
        "--rows",
        type=int,
        default=10_000_000,
        help="rows of each table (dynamic, static and managed-collision alike)",
    )
    ap.add_argument(
        "--id-space",
        type=int,
        default=None,
        help="ids drawn from [0, ID_SPACE) (default: --rows); beyond the rows the dynamic "
        "and managed-collision tables evict, the static ones take the ids modulo their rows",
    )
    ap.add_argument("--alpha", type=float, default=1.05, help="power-law exponent of the ids")
    ap.add_argument(
        "--optimizer",
        nargs="+",
        choices=["adam", "sgd", "rowwise_adagrad"],
        default=["adam"],
        help="fused optimizers, each timed in turn (FBGEMM's CPU kernel has no adam: use sgd "
        "on cpu)",
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
        "--profile-steps",
        type=int,
        default=0,
        help="profiled steps after the timed ones (on the CPU: the ranges only, no kernels)",
    )
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument(
        "--trace-dir",
        default=None,
        help="keep the profiled steps' chrome traces here ({version}_{optimizer}_rank{r}.json)",
    )
    ap.add_argument(
        "--collection",
        choices=["ec", "ebc"],
        default="ec",
        help="EmbeddingCollection (sequence) or EmbeddingBagCollection (SUM pooling)",
    )
    ap.add_argument(
        "--plans",
        nargs="*",
        choices=list(PLANS),
        default=list(PLANS),
        help="TorchRec's plans to time: its planner unconstrained, or one sharding type "
        "with the FUSED kernel",
    )
    ap.add_argument(
        "--mc",
        nargs="*",
        choices=list(sharded_mc.MC_KINDS),
        default=[],
        help="also time TorchRec's managed-collision tables (tools/bench/sharded_mc.py): mch "
        "(MCHManagedCollisionModule), zch (HashZchManagedCollisionModule)",
    )
    ap.add_argument(
        "--mch-policy",
        choices=list(sharded_mc.MCH_POLICIES),
        default=sharded_mc.MCH_POLICIES[0],
        help=f"the eviction policy of --mc mch (default {sharded_mc.MCH_POLICIES[0]})",
    )
    ap.add_argument(
        "--mc-eviction-interval",
        type=int,
        default=1,
        metavar="STEPS",
        help="steps between --mc mch's merges of new ids (default 1: every step)",
    )
    ap.add_argument("--no-dynamicemb", action="store_true", help="time TorchRec's plans only")
    ap.add_argument(
        "--eager",
        action="store_true",
        help="also time dynamicemb with its lookups run eagerly (no CUDA graphs)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads per CPU process")
    args = ap.parse_args(argv)
    dist_launch.check_device_args(ap, args, has_gpu)
    args.which = [f"torchrec:{p}" for p in args.plans] + [f"torchrec:{k}" for k in args.mc]
    if not args.no_dynamicemb:
        args.which.append("dynamicemb")
    if args.eager:
        args.which.append("dynamicemb:eager")
    if not args.which:
        ap.error("nothing to time: no --plans and --no-dynamicemb")
    if args.dedup and args.collection == "ebc":
        ap.error("--dedup: the EmbeddingBagCollection sharders have no index dedup")
    if args.batch % args.world_size:
        ap.error(f"--batch {args.batch} is not a multiple of the world size {args.world_size}")
    if args.id_space is None:
        args.id_space = args.rows
    if args.id_space % MULT == 0:
        ap.error(f"--id-space (default --rows) must not be a multiple of {MULT}")
    if args.tables < 1 or args.features % args.tables:
        ap.error(f"--features {args.features} must split evenly over --tables {args.tables}")
    if (
        min(args.batch, args.features, args.hotness, args.dim, args.rows, args.id_space) < 1
        or min(args.steps, args.mc_eviction_interval) < 1
        or args.warmup < 0
        or args.profile_steps < 0
    ):
        ap.error("sizes, --steps and --mc-eviction-interval must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"sharded {args.collection.upper()}, {args.world_size} {args.device} rank(s): global batch "
        f"{args.batch:,}, {args.tables} table(s) x {args.features // args.tables} feature(s) x "
        f"hotness {args.hotness}, dim {args.dim}, {args.rows:,} rows per table, ids power law "
        f"alpha {args.alpha} over {args.id_space:,}, {', '.join(args.optimizer)}, "
        f"dedup {'on' if args.dedup else 'off'}, "
        f"{args.warmup} warm-up + {args.steps} timed steps"
        + (f" + {args.profile_steps} profiled" if args.profile_steps else ""),
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
