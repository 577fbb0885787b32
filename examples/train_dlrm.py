"""Trains a small DLRM-style click model on dynamic embedding tables (the
project's main job).

The model: dense features through a bottom MLP; sparse features pooled (SUM)
by one EmbeddingBagCollection whose tables are dynamicemb hash tables (raw
64-bit ids, rows created on first sight, evicted when a bucket is full) plus
one ordinary TorchRec table; DLRM's pairwise dot-product interaction; a top
MLP giving the click logit; binary cross-entropy.

The data is generated: power-law (Zipf-like) ids, hashed over the int64
range, and a click label drawn from a hidden model (a per-id weight for every
id of every feature, plus a linear function of the dense features), so the
loss can fall well below log(2).

The tables are planned by DynamicEmbeddingShardingPlanner and sharded by
DistributedModelParallel with dynamicemb's sharder; the dense part is data
parallel. Embedding rows are updated in the backward pass by the sharder's
fused optimizer (rowwise Adagrad or Adam), the dense part by torch's Adam.
One process per GPU (NCCL) when there is a GPU, else processes on the CPU
(gloo).

    python examples/train_dlrm.py [--steps N] [--batch-size B] [--world-size W]
                                  [--device cpu|cuda] [--summary-json PATH]
                                  [--metrics-port PORT [--metrics-wait SECONDS]]

With --metrics-port, rank r serves the tables' OpenTelemetry figures for
Prometheus at http://<host>:PORT+r/metrics (dynamicemb.metrics).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import dist_launch  # examples/dist_launch.py, next to this script
import torch
import torch.distributed as dist

# ------------------------------------------------------------------ features --

# int64 arithmetic wraps around: the multipliers are the signed views of
# 64-bit odd constants (golden ratio; SplitMix64's).
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_INT64_MIN = -(1 << 63)
# dynamicemb reserves the four smallest int64 values as table markers.
_RESERVED_KEYS = 4


@dataclass(frozen=True)
class Feature:
    """One sparse feature and its table.

    ``capacity`` is the table's global row count (``num_embeddings``): a
    dynamic table holds at most about capacity / world_size rows per rank,
    whatever the number of distinct ids. A static table's ids are
    ``[0, capacity)``.
    """

    name: str
    capacity: int
    dynamic: bool = True
    vocab: int = 1 << 22  # distinct ids the power law draws from
    max_length: int = 3  # ids per sample: 1 .. max_length

    @property
    def table(self) -> str:
        return f"t_{self.name}"


FEATURES: tuple[Feature, ...] = (
    # Large enough for every id the default run sees: never evicts.
    Feature("user", capacity=1 << 19, vocab=1 << 20, max_length=1),
    # Far below the distinct ids seen: evicts throughout the run.
    Feature("item", capacity=1 << 12, vocab=1 << 22, max_length=3),
    Feature("query", capacity=1 << 14, vocab=1 << 22, max_length=4),
    # An ordinary TorchRec table (ids in [0, 64)).
    Feature("device", capacity=64, dynamic=False, max_length=1),
)
NUM_DENSE = 13


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def _wrap(x: int) -> int:
    """A Python int as the int64 it wraps to."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >> 63 else x


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 (wrapping arithmetic)."""
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def raw_ids(ranks: torch.Tensor, salt: int) -> torch.Tensor:
    """The raw 64-bit id of each power-law rank: spread over all of int64,
    the reserved smallest values excluded."""
    ids = splitmix64(ranks * _GOLDEN + _wrap(salt))
    return torch.where(ids < _INT64_MIN + _RESERVED_KEYS, ids + _RESERVED_KEYS, ids)


def hidden_weight(ids: torch.Tensor, salt: int) -> torch.Tensor:
    """The hidden model's weight of each id: uniform in [-1, 1), from the id."""
    h = _shr(splitmix64(ids ^ _wrap(salt * _MIX2)), 11)  # 53 random bits
    return h.to(torch.float64) * (2.0 / (1 << 53)) - 1.0


def power_law_ranks(g: torch.Generator, n: int, vocab: int, alpha: float) -> torch.Tensor:
    """Ranks in [1, vocab] with P(rank r) ~ r^-alpha (inverse CDF of the
    continuous power law, floored)."""
    u = torch.rand(n, generator=g, dtype=torch.float64)
    a = 1.0 - alpha
    r = ((vocab**a - 1.0) * u + 1.0) ** (1.0 / a)
    return r.to(torch.int64).clamp_(1, vocab)


@dataclass
class Batch:
    dense: torch.Tensor  # (B, NUM_DENSE) float32
    values: torch.Tensor  # int64, feature-major as a KeyedJaggedTensor wants
    lengths: torch.Tensor  # (len(FEATURES) * B) int64
    labels: torch.Tensor  # (B) float32
    true_logits: torch.Tensor  # (B) float32: the hidden model's logit


class ClickData:
    """Deterministic generated click logs: batch ``(split, step, rank)`` is the
    same whatever the world size or device."""

    # Strength of the hidden model's parts.
    SPARSE_SCALE = 1.6
    DENSE_SCALE = 0.6

    def __init__(self, alpha: float, seed: int) -> None:
        self.alpha = alpha
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self.dense_w = torch.randn(NUM_DENSE, generator=g, dtype=torch.float64)
        self.dense_w *= self.DENSE_SCALE / self.dense_w.norm()

    def batch(self, split: int, step: int, rank: int, batch_size: int) -> Batch:
        g = torch.Generator().manual_seed(
            ((self.seed * 7 + split) * 1_000_003 + step) * 4099 + rank
        )
        dense = torch.randn(batch_size, NUM_DENSE, generator=g, dtype=torch.float64)
        logit = dense @ self.dense_w
        values, lengths = [], []
        for i, f in enumerate(FEATURES):
            lens = torch.randint(1, f.max_length + 1, (batch_size,), generator=g)
            n = int(lens.sum())
            if f.dynamic:
                ids = raw_ids(power_law_ranks(g, n, f.vocab, self.alpha), salt=i + 1)
            else:
                # Categorical with a skew of its own.
                ids = power_law_ranks(g, n, f.capacity, 1.2) - 1
            w = hidden_weight(ids, salt=i + 101)
            bag = torch.repeat_interleave(torch.arange(batch_size), lens)
            mean_w = torch.zeros(batch_size, dtype=torch.float64).index_add_(0, bag, w) / lens
            logit = logit + self.SPARSE_SCALE * mean_w
            values.append(ids)
            lengths.append(lens)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        return Batch(
            dense=dense.float(),
            values=torch.cat(values),
            lengths=torch.cat(lengths),
            labels=labels.float(),
            true_logits=logit.float(),
        )


# --------------------------------------------------------------------- model --


def mlp(sizes: list[int], last_activation: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    """Bottom MLP, pooled embeddings, pairwise dot interaction, top MLP."""

    def __init__(self, ebc: torch.nn.Module, dim: int, num_sparse: int) -> None:
        super().__init__()
        self.sparse_arch = ebc
        self.bottom_mlp = mlp([NUM_DENSE, 64, dim], last_activation=True)
        n = num_sparse + 1
        self.num_pairs = n * (n - 1) // 2
        self.top_mlp = mlp([dim + self.num_pairs, 64, 32, 1], last_activation=False)
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.feature_names = [f.name for f in FEATURES]

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        x = self.bottom_mlp(dense)
        pooled = self.sparse_arch(sparse).to_dict()
        stacked = torch.stack([x] + [pooled[f] for f in self.feature_names], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        pairs = dots[:, self.pair_rows, self.pair_cols]
        return self.top_mlp(torch.cat([x, pairs], dim=1)).squeeze(1)


# --------------------------------------------------------------- sharding --


def embedding_configs(dim: int):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(
            name=f.table,
            num_embeddings=f.capacity,
            embedding_dim=dim,
            feature_names=[f.name],
            pooling=PoolingType.SUM,
        )
        for f in FEATURES
    ]


def fused_params(args) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if args.emb_optimizer == "adam":
        return {
            "optimizer": EmbOptimType.ADAM,
            "learning_rate": args.emb_lr,
            "eps": 1e-8,
            "beta1": 0.9,
            "beta2": 0.999,
        }
    return {
        "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        "learning_rate": args.emb_lr,
        "eps": 1e-8,
    }


def constraints(args, world_size: int) -> dict[str, Any]:
    from torchrec.distributed.planner.types import ParameterConstraints

    from dynamicemb import (
        DynamicEmbInitializerArgs,
        DynamicEmbInitializerMode,
        DynamicEmbScoreStrategy,
        DynamicEmbTableOptions,
        get_table_value_bytes,
    )
    from dynamicemb.planner import DynamicEmbParameterConstraints

    out: dict[str, Any] = {}
    configs = {c.name: c for c in embedding_configs(args.dim)}
    optimizer = fused_params(args)["optimizer"]
    for f in FEATURES:
        if f.dynamic:
            out[f.table] = DynamicEmbParameterConstraints(
                sharding_types=["row_wise"],
                use_dynamicemb=True,
                dynamicemb_options=DynamicEmbTableOptions(
                    bucket_capacity=128,
                    score_strategy=DynamicEmbScoreStrategy.STEP,  # evict the least recently used
                    dist_type="hash_roundrobin",
                    initializer_args=DynamicEmbInitializerArgs(
                        mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.05, upper=0.05
                    ),
                    # Every row in device memory (the ranks share the budget).
                    global_hbm_for_values=get_table_value_bytes(
                        configs[f.table], optimizer, world_size, 128
                    ),
                ),
            )
        else:
            out[f.table] = ParameterConstraints(
                sharding_types=["table_wise"], compute_kernels=["fused"]
            )
    return out


def table_stats(model: torch.nn.Module) -> dict[str, list[int]]:
    """This rank's [rows held, capacity, evictions, insert failures, inserts]
    of every dynamic table (table counters of the fused modules)."""
    stats: dict[str, list[int]] = {}
    from dynamicemb.shard import dynamic_embedding_kernels

    for kernel in dynamic_embedding_kernels(model):
        table = kernel.emb_module.rows.hash_table
        size = kernel.emb_module.rows.sizes()  # every tier: a cache's rows too
        evictions = table.counter("EVICTIONS").tolist()
        failures = table.counter("INSERT_FAILURES").tolist()
        inserts = table.counter("INSERTS").tolist()
        for t, name in enumerate(kernel.table_names):
            stats[name] = [size[t], table.max_capacity(t), evictions[t], failures[t], inserts[t]]
    return stats


# ---------------------------------------------------------------------- soak --


def host_rss_mb() -> float:
    """This process's resident memory now (Linux /proc), in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak_sample(model: torch.nn.Module, step: int, device: torch.device, last: dict) -> list:
    """One soak sample of this rank: [step, host RSS MiB, device MiB allocated,
    device MiB reserved, {table: [rows held, inserts, evictions, failures]}].
    Raises if a table's counters are inconsistent: rows held must equal the
    occupied slots counted from the keys and inserts less evictions, stay
    within the capacity, and the cumulative counters must not decrease."""
    from dynamicemb.shard import dynamic_embedding_kernels

    tables = {}
    for kernel in dynamic_embedding_kernels(model):
        table = kernel.emb_module.rows.hash_table
        size = table.size().tolist()
        counted = table.count().tolist()
        inserts = table.counter("INSERTS").tolist()
        evictions = table.counter("EVICTIONS").tolist()
        failures = table.counter("INSERT_FAILURES").tolist()
        for t, name in enumerate(kernel.table_names):
            now = [size[t], inserts[t], evictions[t], failures[t]]
            problems = []
            if size[t] != counted[t]:
                problems.append(f"size counter {size[t]} != {counted[t]} occupied slots")
            if not 0 <= size[t] <= table.capacity(t):
                problems.append(f"size {size[t]} outside [0, {table.capacity(t)}]")
            if size[t] != inserts[t] - evictions[t]:
                problems.append(
                    f"size {size[t]} != inserts {inserts[t]} - evictions {evictions[t]}"
                )
            if name in last and any(a < b for a, b in zip(now[1:], last[name][1:])):
                problems.append(f"a cumulative counter decreased: {last[name]} -> {now}")
            if problems:
                raise RuntimeError(f"soak: table {name} at step {step}: " + "; ".join(problems))
            tables[name] = now
    dev_alloc = dev_reserved = 0.0
    if device.type == "cuda":
        dev_alloc = torch.cuda.memory_allocated(device) / 2**20
        dev_reserved = torch.cuda.memory_reserved(device) / 2**20
    return [step, round(host_rss_mb(), 1), round(dev_alloc, 1), round(dev_reserved, 1), tables]


# ------------------------------------------------------------------- metrics --


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties counted half)."""
    scores, labels = scores.double().cpu(), labels.double().cpu()
    n_pos = float(labels.sum())
    n_neg = labels.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    uniq, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    # Average rank (1-based) of each distinct score.
    ends = torch.cumsum(counts, 0).double()
    avg_rank = ends - (counts.double() - 1) / 2
    rank_sum = float((avg_rank[inverse] * labels).sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


# ------------------------------------------------------------------- worker --


class Progress:
    """Rank 0's progress: a tqdm bar on a terminal (a one-line \\r counter if
    tqdm is missing); on a pipe or a file, a line every tenth of the run."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled = enabled
        self.total = total
        self.bar = None
        self.done = 0
        self.tty = sys.stdout.isatty()
        self.start = time.perf_counter()
        self.next_line = 1
        if not enabled or not self.tty:
            return
        try:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                desc="train",
                unit="step",
                mininterval=0.5,
                dynamic_ncols=True,
                file=sys.stdout,
            )
        except ImportError:
            self.bar = None

    def update(self, done: int, loss: float) -> None:
        if not self.enabled:
            return
        n, self.done = done - self.done, done
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.update(n)
        elif self.tty:
            print(f"\rtrain {done}/{self.total} loss {loss:.4f}", end="", flush=True)
        elif done * 10 >= self.next_line * self.total:
            self.next_line = done * 10 // self.total + 1
            rate = done / max(time.perf_counter() - self.start, 1e-9)
            print(
                f"train {done:>6}/{self.total} ({100 * done // self.total:3d}%) "
                f"{rate:.1f} steps/s, loss {loss:.4f}",
                flush=True,
            )

    def write(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(("\r" if self.tty else "") + line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.tty:
            print()


def _to_kjt(batch: Batch, device: torch.device):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor(
        keys=[f.name for f in FEATURES],
        values=batch.values.to(device, non_blocking=True),
        lengths=batch.lengths.to(device, non_blocking=True),
    )


def evaluate(
    model, data: ClickData, args, rank: int, world_size: int, device
) -> tuple[float, float]:
    """(log loss, AUC) over the held-out batches of every rank; with
    ``model=None``, those of the hidden model that drew the labels."""
    logits, labels = [], []
    if model is not None:
        model.eval()
    with torch.no_grad():
        for step in range(args.eval_batches):
            b = data.batch(1, step, rank, args.batch_size)
            if model is None:
                logits.append(b.true_logits.to(device))
            else:
                logits.append(model(b.dense.to(device), _to_kjt(b, device)).float())
            labels.append(b.labels.to(device))
    if model is not None:
        model.train()
    logits_t, labels_t = torch.cat(logits), torch.cat(labels)
    if world_size > 1:
        all_logits = [torch.empty_like(logits_t) for _ in range(world_size)]
        all_labels = [torch.empty_like(labels_t) for _ in range(world_size)]
        dist.all_gather(all_logits, logits_t)
        dist.all_gather(all_labels, labels_t)
        logits_t, labels_t = torch.cat(all_logits), torch.cat(all_labels)
    loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits_t, labels_t))
    return loss, auc(logits_t, labels_t)


def train(rank: int, world_size: int, args) -> dict[str, Any] | None:
    """One rank's training; rank 0 returns the run's summary."""
    from torchrec.distributed.planner import Topology
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dynamicemb.planner import DynamicEmbeddingShardingPlanner
    from dynamicemb.shard import DynamicEmbeddingBagCollectionSharder

    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    pg = dist.group.WORLD
    torch.manual_seed(args.seed)  # the same initial dense weights on every rank
    configs = embedding_configs(args.dim)
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    model = DLRM(ebc, args.dim, len(FEATURES))

    sharder = DynamicEmbeddingBagCollectionSharder(fused_params=fused_params(args))
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs,
        topology=Topology(
            world_size=world_size, compute_device=device.type, local_world_size=world_size
        ),
        constraints=constraints(args, world_size),
        batch_size=args.batch_size,
        debug=False,
    )
    model, plan = dist_launch.plan_and_shard(model, planner, sharder, device, pg)
    # Embedding rows (dynamic and static) are updated by the fused optimizer
    # in the backward pass; the rest is dense and data parallel.
    dense_params = [
        p for n, p in model.named_parameters() if "sparse_arch" not in n and p.requires_grad
    ]
    dense_opt = torch.optim.Adam(dense_params, lr=args.dense_lr)

    lead = rank == 0
    endpoint = registry = None
    if args.metrics_port is not None:
        from dynamicemb.metrics import instrument, serve_prometheus

        endpoint = serve_prometheus(args.metrics_port + rank, args.metrics_address)
        registry = instrument(model)
        if lead:
            last = args.metrics_port + world_size - 1
            ports = str(args.metrics_port) + (f"..{last}" if world_size > 1 else "")
            print(f"metrics: /metrics on port {ports} (rank r on {args.metrics_port} + r)")
    data = ClickData(args.alpha, args.seed)
    if lead:
        print(f"plan ({world_size} ranks, {device.type}):")
        for name, ps in plan.plan[next(iter(plan.plan))].items():
            kind = "dynamic" if type(ps).__name__ == "DynamicEmbParameterSharding" else "static"
            extra = ""
            if kind == "dynamic":
                extra = f", {ps.dynamicemb_options.max_capacity:,} rows per rank"
            print(f"  {name:8s} {kind:7s} {ps.sharding_type} / {ps.compute_kernel}{extra}")
    first_eval = evaluate(model, data, args, rank, world_size, device)

    loss_hist = torch.zeros(args.steps, device=device)
    checkpoints = sorted({max(1, round(args.steps * k / 4)) for k in range(1, 5)})
    window = max(1, min(args.log_window, args.steps // 4 or 1))
    progress = Progress(args.steps, lead)
    seen: dict[str, list[torch.Tensor]] = {f.name: [] for f in FEATURES if f.dynamic}
    moving: list[tuple[int, float]] = []
    soak: list[list] = []
    start = time.perf_counter()
    for step in range(args.steps):
        b = data.batch(0, step, rank, args.batch_size)
        if args.count_distinct:
            off = 0
            for f, n in zip(FEATURES, b.lengths.view(len(FEATURES), -1).sum(1).tolist()):
                if f.dynamic:
                    seen[f.name].append(torch.unique(b.values[off : off + n]))
                off += n
        logits = model(b.dense.to(device), _to_kjt(b, device))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, b.labels.to(device))
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_opt.step()
        loss_hist[step] = loss.detach()
        if step + 1 in checkpoints:
            lo = step + 1 - window
            avg = loss_hist[lo : step + 1].sum().reshape(1) / window
            if world_size > 1:
                dist.all_reduce(avg)
                avg /= world_size
            moving.append((step + 1, float(avg)))
            progress.write(
                f"step {step + 1:5d}: loss {float(avg):.4f} (mean of the last {window} steps, all "
                "ranks)"
            )
        if lead and ((step + 1) % 10 == 0 or step + 1 == args.steps):
            progress.update(step + 1, float(loss_hist[step]))
        if args.soak_every and ((step + 1) % args.soak_every == 0 or step + 1 == args.steps):
            soak.append(soak_sample(model, step + 1, device, soak[-1][4] if soak else {}))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    progress.close()

    final_eval = evaluate(model, data, args, rank, world_size, device)
    oracle_eval = evaluate(None, data, args, rank, world_size, device)
    first_window = loss_hist[:window].sum().reshape(1) / window
    if world_size > 1:
        dist.all_reduce(first_window)
        first_window /= world_size

    # Table counters of every rank.
    stats = table_stats(model)
    order = [f.table for f in FEATURES]
    names = sorted(stats, key=lambda n: order.index(n) if n in order else len(order))
    local = torch.tensor([stats[n] for n in names], dtype=torch.int64)
    if world_size > 1:
        local = local.to(device)
        dist.all_reduce(local)
        local = local.cpu()
    if registry is not None:
        # The figures are final now: wait until a scrape has read them and
        # the next one has begun (so the first one's answer went out).
        reads = registry.reads
        if args.metrics_wait > 0 and not registry.wait_for_reads(
            reads, count=2, timeout=args.metrics_wait
        ):
            print(
                f"rank {rank}: /metrics was not scraped within --metrics-wait {args.metrics_wait} s"
            )
        endpoint.shutdown()
    distinct: dict[str, int] = {}
    if args.count_distinct:
        for f in FEATURES:
            if not f.dynamic:
                continue
            mine = torch.unique(torch.cat(seen[f.name]))
            parts: list[Any] = [None] * world_size
            if world_size > 1:
                dist.all_gather_object(parts, mine)
            else:
                parts = [mine]
            distinct[f.table] = int(torch.unique(torch.cat(parts)).numel())
    if not lead:
        return None

    by_feature = {f.table: f for f in FEATURES}
    tables = {}
    for i, name in enumerate(names):
        held, capacity, evictions, failures, inserts = local[i].tolist()
        tables[name] = {
            "rows_held": held,
            "capacity": capacity,
            "evictions": evictions,
            "insert_failures": failures,
            "inserts": inserts,
            "distinct_ids": distinct.get(name),
            "vocab": by_feature[name].vocab,
        }
    examples = args.steps * args.batch_size * world_size
    summary = {
        "world_size": world_size,
        "device": device.type,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seconds": elapsed,
        "steps_per_s": args.steps / elapsed,
        "examples_per_s": examples / elapsed,
        "train_loss_first": float(first_window),
        "train_loss_last": moving[-1][1],
        "train_loss_checkpoints": moving,
        "eval_loss_first": first_eval[0],
        "eval_auc_first": first_eval[1],
        "eval_loss_final": final_eval[0],
        "eval_auc_final": final_eval[1],
        "eval_loss_hidden_model": oracle_eval[0],
        "eval_auc_hidden_model": oracle_eval[1],
        "tables": tables,
    }
    if soak:
        summary["soak"] = {"every": args.soak_every, "samples": soak}
    print_summary(summary)
    return summary


def print_summary(s: dict[str, Any]) -> None:
    print(
        f"trained {s['steps']} steps of {s['batch_size']} x {s['world_size']} examples in "
        f"{s['seconds']:.1f} s: "
        f"{s['steps_per_s']:.1f} steps/s, {s['examples_per_s']:,.0f} examples/s"
    )
    print("dynamic tables (summed over ranks):")
    print(
        f"  {'table':8s} {'rows held':>10s} {'capacity':>10s} {'distinct ids':>12s} "
        f"{'inserts':>10s} {'evictions':>10s} {'insert fails':>12s}"
    )
    for name, t in s["tables"].items():
        d = "-" if t["distinct_ids"] is None else f"{t['distinct_ids']:,}"
        print(
            f"  {name:8s} {t['rows_held']:>10,} {t['capacity']:>10,} {d:>12s} "
            f"{t['inserts']:>10,} {t['evictions']:>10,} {t['insert_failures']:>12,}"
        )
    print(
        f"train loss {s['train_loss_first']:.4f} -> {s['train_loss_last']:.4f} (first and last "
        "window)"
    )
    print(
        f"eval  loss {s['eval_loss_first']:.4f} -> {s['eval_loss_final']:.4f}, "
        f"AUC {s['eval_auc_first']:.4f} -> {s['eval_auc_final']:.4f} (before and after training)"
    )
    print(
        f"eval  loss {s['eval_loss_hidden_model']:.4f}, AUC {s['eval_auc_hidden_model']:.4f} "
        "of the hidden model that drew the labels (the best possible)"
    )


# ------------------------------------------------------------------ launcher --


def _worker(rank: int, world_size: int, port: int, args, result_path: str | None) -> None:
    dist_launch.quiet()
    dist_launch.init_process_group(rank, world_size, port, args.device, args.threads)
    try:
        summary = train(rank, world_size, args)
        if summary is not None and result_path:
            with open(result_path, "w") as f:
                json.dump(summary, f, indent=1)
    finally:
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None):
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--steps", type=int, default=2000, help="training steps (default: 2000)")
    ap.add_argument(
        "--batch-size", type=int, default=256, help="examples per rank and step (default: 256)"
    )
    dist_launch.add_device_args(ap, has_gpu)
    ap.add_argument("--dim", type=int, default=16, help="embedding dim (default: 16)")
    ap.add_argument(
        "--emb-optimizer",
        choices=["rowwise_adagrad", "adam"],
        default="rowwise_adagrad",
        help="fused optimizer of the embedding tables (adam: on cuda only)",
    )
    ap.add_argument("--emb-lr", type=float, default=0.05)
    ap.add_argument("--dense-lr", type=float, default=3e-3)
    ap.add_argument(
        "--alpha", type=float, default=1.05, help="power-law exponent of the ids (default: 1.05)"
    )
    ap.add_argument(
        "--eval-batches", type=int, default=8, help="held-out batches per rank (default: 8)"
    )
    ap.add_argument(
        "--log-window", type=int, default=50, help="steps in a moving-average loss (default: 50)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per CPU process (default: 1)"
    )
    ap.add_argument(
        "--no-count-distinct",
        dest="count_distinct",
        action="store_false",
        help="do not count the distinct ids of the run",
    )
    ap.add_argument("--summary-json", default=None, help="write rank 0's summary here")
    ap.add_argument(
        "--soak-every",
        type=int,
        default=0,
        help="every N steps, check every rank's table counters and record rank 0's host and "
        "device memory in the summary (tools/soak.py); 0: never (default)",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the tables' metrics for Prometheus: rank r at this port + r, path /metrics",
    )
    ap.add_argument("--metrics-address", default="0.0.0.0", help="address of the metrics endpoints")
    ap.add_argument(
        "--metrics-wait",
        type=float,
        default=0.0,
        help="after training, keep serving until the final figures were scraped (at most this "
        "many seconds; default 0: do not wait)",
    )
    args = ap.parse_args(argv)
    dist_launch.check_device_args(ap, args, has_gpu)
    if args.emb_optimizer == "adam" and args.device == "cpu":
        # The static table's FBGEMM kernel (TorchRec's FUSED) has no Adam on
        # the CPU; the dynamic tables would run it.
        ap.error(
            "--emb-optimizer adam needs --device cuda (FBGEMM's CPU kernel of the static table "
            "supports rowwise Adagrad, not Adam)"
        )
    if args.steps < 1 or args.batch_size < 1 or args.world_size < 1:
        ap.error("--steps, --batch-size and --world-size must be positive")
    if args.metrics_port is not None and not 0 < args.metrics_port <= 65536 - args.world_size:
        ap.error(
            f"--metrics-port {args.metrics_port}: ports {args.metrics_port}.."
            f"{args.metrics_port + args.world_size - 1} (one per rank) must lie in 1..65535"
        )
    if args.metrics_wait < 0:
        ap.error(f"--metrics-wait must not be negative, got {args.metrics_wait}")
    if args.soak_every < 0:
        ap.error("--soak-every must not be negative")
    return args


def launch(argv: list[str], timeout: float | None = None) -> tuple[dict[str, Any] | None, str]:
    """Runs this job in a new process with ``argv`` (and this process's
    sys.path); returns (rank 0's summary, or None when the job failed, and
    the job's output)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "summary.json")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]
        )
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv, "--summary-json", path],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            return None, proc.stdout
        with open(path) as f:
            return json.load(f), proc.stdout


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dyn = ", ".join(f"{f.name} ({f.capacity:,} rows)" for f in FEATURES if f.dynamic)
    static = ", ".join(f"{f.name} ({f.capacity} rows)" for f in FEATURES if not f.dynamic)
    print(
        f"DLRM on {args.world_size} {args.device} process(es): dynamic tables {dyn}; static "
        f"{static}; "
        f"{NUM_DENSE} dense features; ids power law alpha {args.alpha}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        result_path = args.summary_json or os.path.join(tmp, "summary.json")
        dist_launch.spawn(_worker, args, result_path)
        with open(result_path) as f:
            summary = json.load(f)
    fell = summary["train_loss_last"] < summary["train_loss_first"]
    return 0 if fell and math.isfinite(summary["train_loss_last"]) else 1


if __name__ == "__main__":
    sys.exit(main())
