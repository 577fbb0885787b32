"""What the main job (examples/train_dlrm.py) reports: rank 0's header, plan
and progress (steps/s, examples/s, ETA), the held-out evaluation (log loss
and AUC over every rank's batches), the tables' figures for Prometheus
(--metrics-port), the soak samples (--soak-every) and, at the end, the run's
summary: the losses, the evaluations and the dynamic tables' counters summed
over the ranks, printed and returned (--summary-json writes it).

``RunLog`` is what a rank records while it trains: every step's loss (the
loss history a checkpoint carries), the distinct ids seen, the soak samples
and the checkpoints written.
"""

import datetime
import math
import os
import sys
import time
from typing import Any

import click_tsv  # examples/click_tsv.py, next to this script
import torch
import torch.distributed as dist

# ------------------------------------------------------------------ figures --


def reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the ranks (a copy, on the CPU)."""
    out = t.detach().clone()
    if dist.get_world_size() > 1:
        dist.all_reduce(out)
    return out.cpu()


def window_mean(mean_loss: torch.Tensor, end: int, window: int) -> float:
    return float(mean_loss[end - window : end].sum() / window)


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


def log_loss_auc(logits: list[torch.Tensor], batches, device: torch.device) -> tuple[float, float]:
    """(log loss, AUC) of every rank's ``logits`` of its held-out ``batches``
    (their labels), gathered over the ranks."""
    logits_t = torch.cat(logits)
    labels_t = torch.cat([b.labels.to(device) for b in batches])
    world_size = dist.get_world_size()
    if world_size > 1:
        all_logits = [torch.empty_like(logits_t) for _ in range(world_size)]
        all_labels = [torch.empty_like(labels_t) for _ in range(world_size)]
        dist.all_gather(all_logits, logits_t)
        dist.all_gather(all_labels, labels_t)
        logits_t, labels_t = torch.cat(all_logits), torch.cat(all_labels)
    loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits_t, labels_t))
    return loss, auc(logits_t, labels_t)


def table_stats(model: torch.nn.Module, since: dict[str, int] | None = None) -> dict[str, list]:
    """This rank's [rows held, capacity, evictions, insert failures, inserts,
    lookups, rejections, refusals] of every dynamic table (table counters and
    the counts of the fused modules; lookups: the distinct ids of each batch,
    less ``since``'s)."""
    stats: dict[str, list[int]] = {}
    from dynamicemb.shard import dynamic_embedding_kernels
    from dynamicemb.storage.stats import StatCol

    for kernel in dynamic_embedding_kernels(model):
        table = kernel.emb_module.rows.hash_table
        size = kernel.emb_module.rows.sizes()  # every tier: a cache's rows too
        evictions = table.counter("EVICTIONS").tolist()
        failures = table.counter("INSERT_FAILURES").tolist()
        inserts = table.counter("INSERTS").tolist()
        counts = kernel.emb_module.stats.counts.cpu()
        for t, name in enumerate(kernel.table_names):
            c = counts[t]
            looked = int(c[StatCol.LOOKUPS]) - (since or {}).get(name, 0)
            stats[name] = [size[t], table.max_capacity(t), evictions[t], failures[t], inserts[t]]
            stats[name] += [looked, int(c[StatCol.REJECTIONS]), int(c[StatCol.REFUSALS])]
    return stats


# --------------------------------------------------------------------- soak --


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


# -------------------------------------------------------------- rank 0's lines --


def header(args, env, source) -> str:
    """The job's first line: the tables, the ranks and the data."""
    dyn = ", ".join(f"{f.name} ({f.capacity:,} rows)" for f in source.features if f.dynamic)
    static = [f"{f.name} ({f.capacity} rows)" for f in source.features if not f.dynamic]
    hosts = env.world_size // env.local_world_size
    where = f"{env.world_size} {args.device} process(es)"
    if hosts > 1:
        where += f" on {hosts} nodes"
    data = (
        f"ids power law alpha {args.alpha}"
        if source.generated
        else f"data {len(source.files)} file(s) from {args.data}"
    )
    return (
        f"DLRM on {where}: dynamic tables {dyn}; static {', '.join(static) or 'none'}; "
        f"{click_tsv.NUM_DENSE} dense features; {data}"
    )


def print_plan(plan, world_size: int, device: torch.device) -> None:
    """Each table's sharding (the first module's plan)."""
    print(f"plan ({world_size} ranks, {device.type}):")
    for name, ps in plan.plan[next(iter(plan.plan))].items():
        kind = "dynamic" if type(ps).__name__ == "DynamicEmbParameterSharding" else "static"
        extra = ""
        if kind == "dynamic":
            extra = f", {ps.dynamicemb_options.max_capacity:,} rows per rank"
        print(f"  {name:8s} {kind:7s} {ps.sharding_type} / {ps.compute_kernel}{extra}")


def _clock(seconds: float) -> str:
    """Seconds as h:mm:ss ("?" when unknown)."""
    if not math.isfinite(seconds):
        return "?"
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    """Rank 0's progress from step ``start`` to ``total``: a tqdm bar on a
    terminal (a one-line \\r counter if tqdm is missing); on a pipe or a
    file, a line every tenth of the run. Each shows steps/s, examples/s and
    the time left at that rate (ETA)."""

    def __init__(self, start: int, total: int, examples_per_step: int, enabled: bool) -> None:
        self.enabled = enabled
        self.first = start
        self.total = total
        self.examples_per_step = examples_per_step
        self.bar = None
        self.done = start
        self.tty = sys.stdout.isatty()
        self.start = time.perf_counter()
        self.next_line = 1
        if not enabled or not self.tty:
            return
        try:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=start,
                desc="train",
                unit="step",
                mininterval=0.5,
                dynamic_ncols=True,
                file=sys.stdout,
            )
        except ImportError:
            self.bar = None

    def rates(self, done: int) -> tuple[float, float, float]:
        """(steps/s, examples/s, seconds left) after ``done`` steps."""
        rate = (done - self.first) / max(time.perf_counter() - self.start, 1e-9)
        left = (self.total - done) / rate if rate > 0 else math.inf
        return rate, rate * self.examples_per_step, left

    def update(self, done: int, loss: float) -> None:
        if not self.enabled:
            return
        n, self.done = done - self.done, done
        rate, examples, left = self.rates(done)
        if self.bar is not None:  # tqdm shows steps/s and the ETA itself
            self.bar.set_postfix_str(f"{examples:,.0f} examples/s, loss {loss:.4f}", refresh=False)
            self.bar.update(n)
            return
        line = (
            f"train {done:>6}/{self.total} ({100 * done // self.total:3d}%) {rate:.1f} steps/s, "
            f"{examples:,.0f} examples/s, ETA {_clock(left)}, loss {loss:.4f}"
        )
        if self.tty:
            print("\r" + line, end="", flush=True)
            return
        run = self.total - self.first
        if (done - self.first) * 10 >= self.next_line * run:
            self.next_line = (done - self.first) * 10 // run + 1
            print(line, flush=True)

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


# ------------------------------------------------------------------ metrics --


class MetricsEndpoint:
    """--metrics-port: rank ``rank`` serves its tables' OpenTelemetry figures
    for Prometheus at port --metrics-port + rank, path /metrics
    (dynamicemb.metrics), until ``close``."""

    def __init__(self, model: torch.nn.Module, args, rank: int, world_size: int) -> None:
        from dynamicemb.metrics import instrument, serve_prometheus

        self.rank = rank
        self.wait = args.metrics_wait
        self.endpoint = serve_prometheus(args.metrics_port + rank, args.metrics_address)
        self.registry = instrument(model)
        if rank == 0:
            last = args.metrics_port + world_size - 1
            ports = str(args.metrics_port) + (f"..{last}" if world_size > 1 else "")
            print(f"metrics: /metrics on port {ports} (rank r on {args.metrics_port} + r)")

    def close(self) -> None:
        """Once the figures are final: waits (at most --metrics-wait seconds)
        until a scrape has read them and the next one has begun (so the
        first one's answer went out), then stops serving."""
        reads = self.registry.reads
        if self.wait > 0 and not self.registry.wait_for_reads(reads, count=2, timeout=self.wait):
            print(f"rank {self.rank}: /metrics was not scraped within --metrics-wait {self.wait} s")
        self.endpoint.shutdown()


# ------------------------------------------------------------------ the run --


class RunLog:
    """What rank ``env.rank`` records of its run from step ``start`` to
    --steps: every step's loss, the distinct ids of the dynamic tables (a run
    from step 0 with --count-distinct), soak samples (--soak-every) and the
    checkpoints written; rank 0's progress lines; the run's summary.

    ``loss_sum``: the loss history of a checkpoint resumed from (each step's
    loss summed over the ranks that ran it, ``loss_world`` of them), or None.
    """

    def __init__(
        self,
        args,
        env,
        device: torch.device,
        features,
        start: int,
        loss_sum=None,
        loss_world: int | None = None,
    ) -> None:
        self.args, self.env, self.device, self.features = args, env, device, features
        self.start = start
        self.lead = env.rank == 0
        # Per-step loss of this rank; steps before a resume hold, on rank 0
        # (0 elsewhere), the sum over the ranks scaled to this world size (the
        # mean times it), so a sum over ranks divided by the world size is
        # each step's mean whatever world ran it.
        self.loss = torch.zeros(args.steps, device=device)
        if loss_sum is not None and self.lead:
            scale = env.world_size / (loss_world or env.world_size)
            self.loss[:start] = loss_sum.to(device) * scale
        self.report_points = sorted({max(1, round(args.steps * k / 4)) for k in range(1, 5)})
        self.window = max(1, min(args.log_window, args.steps // 4 or 1))
        self.progress = Progress(start, args.steps, args.batch_size * env.world_size, self.lead)
        self.count = args.count_distinct and start == 0
        self.seen: dict[str, list[torch.Tensor]] = {f.name: [] for f in features if f.dynamic}
        self.soak: list[list] = []
        self.saved: list[dict[str, Any]] = []
        self.looked: dict[str, int] = {}  # lookups before training (begin)
        self.stats: dict[str, list] | None = None  # the tables' after training (close)

    def begin(self, model: torch.nn.Module) -> None:
        """Notes the lookups so far (the first evaluation's): the summary
        counts training's."""
        self.looked = {name: s[5] for name, s in table_stats(model).items()}

    def count_ids(self, batch) -> None:
        """Keeps the distinct ids of ``batch``'s dynamic features."""
        if not self.count:
            return
        off = 0
        lengths = batch.lengths.view(len(self.features), -1).sum(1).tolist()
        for f, n in zip(self.features, lengths):
            if f.dynamic:
                self.seen[f.name].append(torch.unique(batch.values[off : off + n]))
            off += n

    def step(self, step: int, loss: torch.Tensor, model: torch.nn.Module) -> None:
        """Records step ``step``'s loss (0-based); reports and soaks where due."""
        self.loss[step] = loss.detach()
        done, args = step + 1, self.args
        if done in self.report_points and done >= self.window:
            avg = window_mean(reduce_sum(self.loss) / self.env.world_size, done, self.window)
            self.progress.write(
                f"step {done:5d}: loss {avg:.4f} (mean of the last {self.window} steps, all ranks)"
            )
        if self.lead and (done % 10 == 0 or done == args.steps):
            self.progress.update(done, float(self.loss[step]))
        if args.soak_every and (done % args.soak_every == 0 or done == args.steps):
            last = self.soak[-1][4] if self.soak else {}
            self.soak.append(soak_sample(model, done, self.device, last))

    def loss_sums(self, done: int) -> torch.Tensor:
        """The loss history of steps 1 .. ``done``, each summed over the ranks
        (each step's mean times this world size: what a checkpoint carries,
        with its world size; every rank calls it)."""
        return reduce_sum(self.loss)[:done]

    def checkpointed(self, done: int, path: str, seconds: float) -> None:
        self.saved.append({"step": done, "path": path, "seconds": seconds})
        self.progress.write(f"checkpoint after step {done}: {path} ({seconds:.2f} s)")

    def close(self, model: torch.nn.Module) -> None:
        """Ends the progress bar; reads the tables' counters before the final
        evaluation looks more ids up."""
        self.progress.close()
        self.stats = table_stats(model, self.looked)

    def summary(
        self, model, seconds: float, evals: dict, data: dict, resumed, warm
    ) -> dict[str, Any] | None:
        """The run's summary on rank 0 (None elsewhere; every rank calls it):
        ``evals`` holds the (log loss, AUC) pairs "first", "final" and
        "hidden_model" (each may be None), ``data`` the data's description,
        ``resumed`` and ``warm`` the resume's and warm start's entries."""
        args, world_size = self.args, self.env.world_size
        mean_loss = reduce_sum(self.loss) / world_size
        window = self.window
        moving = [(p, window_mean(mean_loss, p, min(window, p))) for p in self.report_points]
        # Table counters of every rank.
        stats = self.stats if self.stats is not None else table_stats(model, self.looked)
        order = [f.table for f in self.features]
        names = sorted(stats, key=lambda n: order.index(n) if n in order else len(order))
        local = torch.tensor([stats[n] for n in names], dtype=torch.int64)
        if world_size > 1:
            local = local.to(self.device)
            dist.all_reduce(local)
            local = local.cpu()
        distinct = self._distinct()
        if not self.lead:
            return None
        by_feature = {f.table: f for f in self.features}
        tables = {}
        for i, name in enumerate(names):
            held, capacity, evictions, failures, inserts, looked, rejected, refused = local[
                i
            ].tolist()
            tables[name] = {
                "rows_held": held,
                "capacity": capacity,
                "evictions": evictions,
                "insert_failures": failures,
                "inserts": inserts,
                "train_lookups": looked,
                "rejections": rejected,
                "refusals": refused,
                "distinct_ids": distinct.get(name),
                "vocab": by_feature[name].vocab,
            }
        run = args.steps - self.start
        first, final, oracle = evals["first"], evals["final"], evals["hidden_model"]
        summary = {
            "world_size": world_size,
            "nodes": world_size // self.env.local_world_size,
            "device": self.device.type,
            "steps": args.steps,
            "start_step": self.start,
            "steps_run": run,
            "batch_size": args.batch_size,
            "embedding_dtype": args.embedding_dtype,
            "seconds": seconds,
            "steps_per_s": run / seconds if run else 0.0,
            "examples_per_s": run * args.batch_size * world_size / seconds if run else 0.0,
            "checkpoint_seconds": sum(c["seconds"] for c in self.saved),
            "train_loss_first": window_mean(mean_loss, window, window),
            "train_loss_last": moving[-1][1],
            "train_loss_checkpoints": moving,
            "eval_loss_first": first[0] if first else None,
            "eval_auc_first": first[1] if first else None,
            "eval_loss_final": final[0] if final else None,
            "eval_auc_final": final[1] if final else None,
            "eval_loss_hidden_model": oracle[0] if oracle else None,
            "eval_auc_hidden_model": oracle[1] if oracle else None,
            "tables": tables,
            "data": data,
            "resumed": resumed,
            "warm_start": warm,
            "checkpoints": self.saved,
        }
        if self.soak:
            summary["soak"] = {"every": args.soak_every, "samples": self.soak}
        print_summary(summary)
        return summary

    def _distinct(self) -> dict[str, int]:
        """The distinct ids each dynamic table saw on every rank (none when
        not counted)."""
        distinct: dict[str, int] = {}
        if not self.count:
            return distinct
        world_size = self.env.world_size
        for f in self.features:
            if not f.dynamic:
                continue
            mine = torch.unique(torch.cat(self.seen[f.name]))
            parts: list[Any] = [None] * world_size
            if world_size > 1:
                dist.all_gather_object(parts, mine)
            else:
                parts = [mine]
            distinct[f.table] = int(torch.unique(torch.cat(parts)).numel())
        return distinct


def print_summary(s: dict[str, Any]) -> None:
    ran = f"{s['steps_run']} steps" + (
        f" (steps {s['start_step'] + 1}..{s['steps']}, resumed)" if s["start_step"] else ""
    )
    print(
        f"trained {ran} of {s['batch_size']} x {s['world_size']} examples in "
        f"{s['seconds']:.1f} s: "
        f"{s['steps_per_s']:.1f} steps/s, {s['examples_per_s']:,.0f} examples/s"
    )
    if s["checkpoints"]:
        print(
            f"checkpoints: {len(s['checkpoints'])} written in {s['checkpoint_seconds']:.1f} s, the "
            f"last {s['checkpoints'][-1]['path']}"
        )
    print("dynamic tables (summed over ranks" + (", since the resume):" if s["resumed"] else "):"))
    print(
        f"  {'table':8s} {'rows held':>10s} {'capacity':>10s} {'distinct ids':>12s} "
        f"{'inserts':>10s} {'evictions':>10s} {'insert fails':>12s} {'rejections':>10s} "
        f"{'refusals':>10s}"
    )
    for name, t in s["tables"].items():
        d = "-" if t["distinct_ids"] is None else f"{t['distinct_ids']:,}"
        print(
            f"  {name:8s} {t['rows_held']:>10,} {t['capacity']:>10,} {d:>12s} "
            f"{t['inserts']:>10,} {t['evictions']:>10,} {t['insert_failures']:>12,} "
            f"{t['rejections']:>10,} {t['refusals']:>10,}"
        )
    print(
        f"train loss {s['train_loss_first']:.4f} -> {s['train_loss_last']:.4f} (first and last "
        "window)"
    )
    if s["eval_loss_final"] is None:
        print("eval  none (no held-out data: --eval-data)")
        return
    print(
        f"eval  loss {s['eval_loss_first']:.4f} -> {s['eval_loss_final']:.4f}, "
        f"AUC {s['eval_auc_first']:.4f} -> {s['eval_auc_final']:.4f} (before and after training)"
    )
    if s["eval_loss_hidden_model"] is not None:
        print(
            f"eval  loss {s['eval_loss_hidden_model']:.4f}, AUC {s['eval_auc_hidden_model']:.4f} "
            "of the hidden model that drew the labels (the best possible)"
        )
