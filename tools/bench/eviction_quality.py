"""Which rows a dynamic table keeps: hit rates of every score strategy, with
and without admission and refuse_cold_keys, on HierarchicalKV's two
eviction-quality protocols and on the main job's data; the main job's eval AUC.

    python tools/bench/eviction_quality.py [--device cpu|cuda] [--scale S]
        [--protocols cache admission job] [--job-steps N] [--json PATH]

Every size is HierarchicalKV's divided by ``--scale`` (1: its own; CI runs a
tiny one). The keys are drawn on the CPU from seeded generators, so both
backends see the same keys.

cache
    A table of C = 2^24 / S slots (buckets of 128) takes 5C keys drawn from a
    Zipf law of exponent 0.99 over a key range of 10C (the key is the rank),
    in batches of C / 16, each a
    training step of a ``BatchedDynamicEmbeddingTablesV2``. Hit rate: the
    share of a batch's keys (every occurrence) the table held when the batch
    arrived (``TableStorage.contains``), over the second half of the stream
    (the table full) and over all of it. Beside them: ``oracle``, the share of
    those draws among the C most probable keys (a table that held exactly
    them), and ``random``, a CUSTOMIZED table scored at random each batch
    (eviction blind to recency and frequency).
admission
    A table of C = 2^24 / S slots is filled with distinct keys, each seen
    twice (LFU frequency 2), until its load reaches 0.96; then C / 4 new keys,
    each seen once, arrive in one batch. Hit rate of the resident keys
    afterwards (the share still held); the loss is 100 - that, in points.
job
    examples/train_dlrm.py, one process, ``--job-steps`` steps of 256
    examples (the job's defaults otherwise: rowwise Adagrad at learning rate
    0.05, STEP scores), once per option: the eval AUC after training, and per dynamic
    table the training lookups' hit rate (distinct ids per batch found:
    1 - (inserts + insert failures + rejections + refusals) / lookups, from
    the job's summary).

Options: the score strategies TIMESTAMP, STEP, LFU, (TIMESTAMP, LFU) and
(TIMESTAMP, LFU) with a ``score_function`` (the frequency less one per second
since the key was last seen); each without and with a
``FrequencyAdmissionStrategy(threshold=2)``, and with ``refuse_cold_keys``
where a newcomer can be colder than a resident key (LFU, the compound, the
random scores); on the job, the embedding optimizer too (row-wise RMSprop AR,
without and with adaptive regularization and the warm-up of new rows, against
rowwise Adagrad, at learning rate 0.02). Prints one table per protocol, and
with ``--json`` writes every figure.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
import warnings

import torch

from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb import (
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    FrequencyAdmissionStrategy,
    KVCounter,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.storage.stats import StatCol

S = DynamicEmbScoreStrategy
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# HierarchicalKV's sizes and law (scaled by --scale).
FULL_CAPACITY = 1 << 24
ZIPF_EXPONENT = 0.99
KEY_RANGE = 10  # key range / capacity
INSERTS = 5  # inserted keys / capacity
BATCHES_PER_CAPACITY = 16  # batch = capacity / 16
LOAD = 0.96
NEWCOMERS = 4  # capacity / newcomers
BUCKET = 128
ADMISSION_THRESHOLD = 2


def decayed_lfu(scores, cur_timestamp):
    """score_function over (timestamp, frequency): the frequency less one
    per second since the key was last seen."""
    return scores[1] - (cur_timestamp - scores[0]) * 1e-9


# name -> (score_strategy, score_function, refuse_cold_keys allowed)
STRATEGIES = {
    "timestamp": (S.TIMESTAMP, None, False),
    "step": (S.STEP, None, False),
    "lfu": (S.LFU, None, True),
    "timestamp_lfu": ((S.TIMESTAMP, S.LFU), None, True),
    "score_function": ((S.TIMESTAMP, S.LFU), decayed_lfu, False),
    "random": (S.CUSTOMIZED, None, True),
}


def options(name: str, admission: bool, refuse: bool) -> list[tuple[str, bool, bool]]:
    """The (strategy, admission, refusal) variants of a strategy."""
    out = [(name, False, False), (name, True, False)] if admission else [(name, False, False)]
    if refuse and STRATEGIES[name][2]:
        out.append((name, False, True))
    return out


def zipf_ranks(g: torch.Generator, n: int, key_range: int) -> torch.Tensor:
    """n ranks of the discrete Zipf law over [1, key_range]: P(rank r) =
    r^-0.99 / sum_k k^-0.99, by rejection-inversion (Hormann and Derflinger,
    1996), every sample drawn at once and the rejected ones again."""
    e = ZIPF_EXPONENT

    def h(x):
        return torch.exp(-e * torch.log(x))

    def h_integral(x):
        log_x = torch.log(x)
        return torch.expm1((1.0 - e) * log_x) / (1.0 - e)

    def h_integral_inverse(x):
        t = (x * (1.0 - e)).clamp(min=-1.0)
        return torch.exp(torch.log1p(t) / (1.0 - e))

    def dbl(v):
        return torch.tensor(float(v), dtype=torch.float64)

    hi_x1 = h_integral(dbl(1.5)) - 1.0
    hi_n = h_integral(dbl(key_range + 0.5))
    s = 2.0 - h_integral_inverse(h_integral(dbl(2.5)) - h(dbl(2.0)))
    out = torch.empty(n, dtype=torch.int64)
    todo = torch.arange(n)
    while todo.numel():
        u = hi_n + torch.rand(todo.numel(), generator=g, dtype=torch.float64) * (hi_x1 - hi_n)
        x = h_integral_inverse(u)
        k = (x + 0.5).floor().clamp(1, key_range)
        ok = (k - x <= s) | (u >= h_integral(k + 0.5) - h(k))
        out[todo[ok]] = k[ok].to(torch.int64)
        todo = todo[~ok]
    return out


def module(strategy: str, capacity: int, device, admission: bool, refuse: bool):
    score, fn, _ = STRATEGIES[strategy]
    admit = None
    if admission:
        counter = KVCounter(capacity=max(capacity, 1024), bucket_capacity=BUCKET)
        admit = FrequencyAdmissionStrategy(ADMISSION_THRESHOLD, counter)
    eviction = dict(score_strategy=score, score_function=fn, refuse_cold_keys=refuse)
    # Every row in device memory (a budget above the table's rows).
    opts = DynamicEmbTableOptions(
        dim=4, max_capacity=capacity, bucket_capacity=BUCKET, local_hbm_for_values=1 << 40
    )
    opts = dataclasses.replace(opts, admit_strategy=admit, **eviction)
    # SGD at learning rate 0: a training step that changes no embedding.
    return BatchedDynamicEmbeddingTablesV2(
        [opts], None, Pool.NONE, learning_rate=0.0, device=device
    ).train()


def step(m, keys: torch.Tensor, strategy: str, g: torch.Generator) -> int:
    """One training step of ``keys`` (on the module's device); returns the
    occurrences the table held when it began."""
    if strategy == "random":
        with warnings.catch_warnings():  # random scores fall as often as they rise
            warnings.simplefilter("ignore")
            m.set_score(int(torch.randint(0, 2**62, (1,), generator=g)))
    held = int(m.storage.contains(keys, torch.zeros_like(keys)).sum())
    out = m(keys, torch.tensor([0, keys.numel()], device=keys.device))
    out.sum().backward()
    return held


def cache_protocol(device, scale: int, variants) -> list[dict]:
    capacity = FULL_CAPACITY // scale
    key_range = KEY_RANGE * capacity
    batch = capacity // BATCHES_PER_CAPACITY
    steps = INSERTS * BATCHES_PER_CAPACITY
    g = torch.Generator().manual_seed(0)
    stream = [zipf_ranks(g, batch, key_range) for _ in range(steps)]
    second = stream[steps // 2 :]
    oracle = float(torch.cat(second).le(capacity).double().mean())
    rows = [dict(protocol="cache", option="oracle", hit_rate=oracle, hit_rate_all=None)]
    for strategy, admission, refuse in variants:
        m = module(strategy, capacity, device, admission, refuse)
        rg = torch.Generator().manual_seed(1)
        began = time.perf_counter()
        hits = [step(m, keys.to(device), strategy, rg) for keys in stream]
        counts = m.stats.counts[0].cpu()
        rows.append(
            dict(
                protocol="cache",
                option=label(strategy, admission, refuse),
                hit_rate=sum(hits[steps // 2 :]) / (batch * len(second)),
                hit_rate_all=sum(hits) / (batch * steps),
                evictions=int(m.rows.hash_table.counter("EVICTIONS")[0]),
                refusals=int(counts[StatCol.REFUSALS]),
                rejections=int(counts[StatCol.REJECTIONS]),
                seconds=round(time.perf_counter() - began, 2),
            )
        )
    return rows


def admission_protocol(device, scale: int, variants) -> list[dict]:
    capacity = FULL_CAPACITY // scale
    batch = capacity // BATCHES_PER_CAPACITY
    g = torch.Generator().manual_seed(2)
    order = torch.randperm(2 * capacity, generator=g) + 1
    rows = []
    for strategy, admission, refuse in variants:
        m = module(strategy, capacity, device, admission, refuse)
        rg = torch.Generator().manual_seed(3)
        size, cursor = 0, 0
        while size < LOAD * capacity:
            want = min(batch, math.ceil(LOAD * capacity) - size)
            keys = order[cursor : cursor + want].to(device)
            cursor += want
            step(m, torch.cat([keys, keys]), strategy, rg)  # each seen twice
            size = int(m.rows.sizes()[0])
        residents = order[:cursor].to(device)
        residents = residents[m.storage.contains(residents, torch.zeros_like(residents))]
        load = residents.numel() / capacity
        step(m, order[cursor : cursor + capacity // NEWCOMERS].to(device), strategy, rg)
        kept = m.storage.contains(residents, torch.zeros_like(residents)).double().mean()
        counts = m.stats.counts[0].cpu()
        rows.append(
            dict(
                protocol="admission",
                option=label(strategy, admission, refuse),
                load=round(load, 4),
                hit_rate=float(kept),
                loss_points=round(100.0 * (1.0 - float(kept)), 2),
                refusals=int(counts[StatCol.REFUSALS]),
                rejections=int(counts[StatCol.REJECTIONS]),
            )
        )
    return rows


JOB_OPTIONS = {
    # name -> train_dlrm.py flags beside the defaults (rowwise Adagrad, STEP)
    "step": [],
    "timestamp": ["--score-strategy", "timestamp"],
    "lfu": ["--score-strategy", "lfu"],
    "timestamp_lfu": ["--score-strategy", "timestamp_lfu"],
    "score_function": ["--score-strategy", "decayed_lfu"],
}


def job_variants(names, admission: bool, refuse: bool, optimizers: bool) -> list[tuple]:
    out = []
    for name in names:
        for strategy, adm, ref in options(name, admission, refuse):
            flags = list(JOB_OPTIONS[strategy])
            if adm:
                flags += ["--admission-threshold", str(ADMISSION_THRESHOLD)]
            if ref:
                flags += ["--refuse-cold-keys"]
            out.append((label(strategy, adm, ref), flags))
    if optimizers:
        # At the learning rate that suits both (the job's default, 0.05, is
        # rowwise Adagrad's; RMSprop's steps do not shrink as rows age).
        lr = ["--emb-lr", "0.02"]
        rms = lr + ["--emb-optimizer", "rowwise_rmsprop_ar"]
        ar, warm = ["--ar-alpha", "0.05"], ["--row-warmup-steps", "4"]
        out += [
            ("rowwise_adagrad lr=0.02", lr),
            ("rmsprop_ar lr=0.02", rms),
            ("rmsprop_ar lr=0.02 warmup=4", rms + warm),
            ("rmsprop_ar lr=0.02 ar_alpha=0.05", rms + ar),
            ("rmsprop_ar lr=0.02 ar_alpha=0.05 warmup=4", rms + ar + warm),
        ]
    return out


def job_protocol(device, steps: int, variants) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # The job's main from this process (dist_launch.run_here): torch,
        # TorchRec and dynamicemb imported once for every option.
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        import dist_launch
        import train_dlrm

        log = os.path.join(tmp, "jobs.log")
        for option, flags in variants:
            summary = os.path.join(tmp, "summary.json")
            argv = [
                *("--device", device.type, "--world-size", "1", "--steps", str(steps)),
                *("--batch-size", "256", "--summary-json", summary, *flags),
            ]
            rc, out = dist_launch.run_here(train_dlrm.main, argv, log)
            if rc not in (0, 1):  # 1: the loss did not fall (reported)
                cmd = " ".join(["examples/train_dlrm.py", *argv])
                raise RuntimeError(f"{option}: {cmd} (exit status {rc})\n{out[-4000:]}")
            with open(summary) as f:
                s = json.load(f)
            os.remove(summary)
            row = dict(protocol="job", option=option, eval_auc=s["eval_auc_final"])
            row["eval_loss"] = s["eval_loss_final"]
            for name, t in s["tables"].items():
                missed = t["inserts"] + t["insert_failures"] + t["rejections"] + t["refusals"]
                row[f"hit_rate_{name}"] = 1.0 - missed / max(t["train_lookups"], 1)
            rows.append(row)
    return rows


def label(strategy: str, admission: bool, refuse: bool) -> str:
    return strategy + (" +admission" if admission else "") + (" +refuse_cold" if refuse else "")


def print_table(rows: list[dict]) -> None:
    cols = [c for c in rows[-1] if c != "protocol"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", type=int, default=1, help="divide HierarchicalKV's sizes by this")
    ap.add_argument("--protocols", nargs="+", default=["cache", "admission", "job"])
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--job-steps", type=int, default=1000)
    ap.add_argument("--no-admission", dest="admission", action="store_false")
    ap.add_argument("--no-refusal", dest="refuse", action="store_false")
    ap.add_argument("--no-optimizers", dest="optimizers", action="store_false")
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args(argv)
    if args.scale < 1 or FULL_CAPACITY // args.scale < BUCKET * BATCHES_PER_CAPACITY:
        ap.error(f"--scale must be in 1..{FULL_CAPACITY // (BUCKET * BATCHES_PER_CAPACITY)}")
    device = torch.device(args.device)
    variants = [v for n in args.strategies for v in options(n, args.admission, args.refuse)]
    results = []
    print(f"device {device}, table capacity {FULL_CAPACITY // args.scale:,} (scale 1/{args.scale})")
    print(f"main job: {args.job_steps} steps of 256 examples, one process\n")
    if "cache" in args.protocols:
        results.append(cache_protocol(device, args.scale, variants))
    if "admission" in args.protocols:
        no_random = [v for v in variants if v[0] != "random"]
        results.append(admission_protocol(device, args.scale, no_random))
    if "job" in args.protocols:
        names = [n for n in args.strategies if n in JOB_OPTIONS]
        jv = job_variants(names, args.admission, args.refuse, args.optimizers)
        results.append(job_protocol(device, args.job_steps, jv))
    for rows in results:
        print(f"## {rows[0]['protocol']}")
        print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            rows = sum(results, [])
            json.dump({"device": str(device), "scale": args.scale, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
