"""CPU throughput of the scored hash table against two baselines measured in
the same run: a Python dict and a sorted-keys table in plain PyTorch.

    python tools/bench/table_cpu_bench.py [--capacity 4194304] [--batch 262144]
        [--reps 5] [--load-factors 0.5 1.0] [--write docs/benchmarks/table_cpu.md]

For each load factor the table is pre-filled (new random keys, ASSIGN scores),
then one batch is timed per repetition; the median is reported:

  find              keys resident in the table (all hits)
  insert            find-or-insert of new keys; a full bucket fails (at load
                    factor 1.0 every key fails: that is the cost of finding out)
  insert_and_evict  new keys; a full bucket evicts its minimum-score key

Every repetition of insert / insert_and_evict starts from a copy of the
pre-filled state and uses a fresh batch, so the load factor is what the row
says. Throughput is keys per second of wall time, and per core: divided by the
threads the implementation uses (torch.get_num_threads() for the table and the
torch baseline, 1 for the dict).

Baselines:
  dict      find: d.get(k) per key; insert: d.setdefault(k, slot) per key;
            insert_and_evict: d[k] = slot plus `del` of one resident key per new key.
            The keys are Python ints prepared before timing.
  sorted    a torch table of sorted keys (torch.sort once): find =
            torch.searchsorted + a gather and compare; insert = torch.cat + torch.sort
            of all keys. No eviction variant.
"""

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch

# Runnable from a checkout without installing the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from dynamicemb.table import ScoredHashTable

# Heading of the section of docs/benchmarks/table_cpu.md that
# tools/bench/one_bucket_bench.py fills; --write leaves it as it is.
ONE_BUCKET_SECTION = "## One bucket per table"


class Fresh:
    """Random distinct-enough int64 keys: each call draws from a new 2**40 range
    (repeats within a draw of a few million keys are a handful at most)."""

    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.base = 1

    def __call__(self, n: int) -> torch.Tensor:
        k = torch.randint(0, 1 << 40, (n,), generator=self.g) + (self.base << 40)
        self.base += 1
        return k


def timed(fn: Callable[[], object], setup: Callable[[], object] | None, reps: int) -> float:
    """Median seconds of `fn` over `reps` runs, `setup` (untimed) before each."""
    times = []
    for _ in range(reps):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------ table --


def prefill(table: ScoredHashTable, fresh: Fresh, load_factor: float) -> torch.Tensor:
    """Fills the table to `load_factor` with new keys (insert: a key whose
    bucket is full just fails); returns the resident keys. Below 1.0 each round
    inserts exactly the keys missing, so the fill stops at the target; the last
    free slots of a full table take rounds of 16 keys per bucket."""
    cap = table.capacity(0)
    target = int(round(load_factor * cap))
    one = torch.ones(1, 1, dtype=torch.int64)
    min_round = 16 * (cap // table.bucket_capacity(0))
    while True:
        need = target - int(table.size()[0])
        if need <= 0:
            break
        n = max(need, min_round) if target == cap else need
        table.insert(fresh(n), policies=[1], scores=one)
    return table.export_batch().compact().keys


def bench_table(table, resident, fresh, batch, reps) -> dict[str, float]:
    g = torch.Generator().manual_seed(7)
    hits = resident[torch.randint(0, resident.numel(), (batch,), generator=g)]
    out = {"find": timed(lambda: table.find(hits), None, reps)}

    saved = [x.clone() for x in (table.keys, table.digests, table.scores, table.counters)]

    def restore():
        for dst, src in zip((table.keys, table.digests, table.scores, table.counters), saved):
            dst.copy_(src)

    score = torch.full((1, 1), 2, dtype=torch.int64)
    for name, call in (("insert", table.insert), ("insert_and_evict", table.insert_and_evict)):
        batches = [fresh(batch) for _ in range(reps)]
        it = iter(batches)
        cur = {}

        def setup():
            restore()
            cur["k"] = next(it)

        out[name] = timed(lambda: call(cur["k"], policies=[1], scores=score), setup, reps)
    restore()
    return out


# -------------------------------------------------------------- baselines --


def bench_dict(resident: torch.Tensor, fresh: Fresh, batch: int, reps: int) -> dict[str, float]:
    res_list = resident.tolist()
    d = dict(zip(res_list, range(len(res_list))))
    g = torch.Generator().manual_seed(7)
    hits = resident[torch.randint(0, resident.numel(), (batch,), generator=g)].tolist()

    def find():
        get = d.get
        return [get(k, -1) for k in hits]

    out = {"find": timed(find, None, reps)}

    batches = [fresh(batch).tolist() for _ in range(reps)]
    victims = [res_list[i * batch : (i + 1) * batch] for i in range(reps)]
    state = {"i": -1, "undo": None}

    def undo():
        if state["undo"]:
            state["undo"]()
            state["undo"] = None

    def setup():
        undo()
        state["i"] += 1

    def insert():
        ks = batches[state["i"]]
        setd = d.setdefault
        n = len(d)
        for j, k in enumerate(ks):
            setd(k, n + j)
        state["undo"] = lambda ks=ks: [d.pop(k, None) for k in ks]

    out["insert"] = timed(insert, setup, reps)
    undo()
    state["i"] = -1

    def insert_and_evict():
        ks, vs = batches[state["i"]], victims[state["i"]]
        for k, v in zip(ks, vs):
            slot = d.pop(v)
            d[k] = slot

        def undo(ks=ks, vs=vs):
            for k, v in zip(ks, vs):
                d[v] = d.pop(k)

        state["undo"] = undo

    out["insert_and_evict"] = timed(insert_and_evict, setup, reps)
    undo()
    assert len(d) == len(res_list)
    return out


def bench_sorted(resident: torch.Tensor, fresh: Fresh, batch: int, reps: int) -> dict[str, float]:
    sorted_keys, perm = torch.sort(resident)
    g = torch.Generator().manual_seed(7)
    hits = resident[torch.randint(0, resident.numel(), (batch,), generator=g)]

    def find():
        idx = torch.searchsorted(sorted_keys, hits).clamp_(max=sorted_keys.numel() - 1)
        found = sorted_keys[idx] == hits
        return torch.where(found, perm[idx], torch.full_like(idx, -1))

    out = {"find": timed(find, None, reps)}
    batches = [fresh(batch) for _ in range(reps)]
    it = iter(batches)

    def insert():
        k = next(it)
        return torch.sort(torch.cat([sorted_keys, k]))

    out["insert"] = timed(insert, None, reps)
    return out


# ----------------------------------------------------------------- report --


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def fmt(x: float) -> str:
    return f"{x / 1e6:,.1f} M"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--capacity", type=int, default=1 << 22)
    ap.add_argument("--bucket-capacity", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1 << 18)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--write", default=None, help="also write the report (markdown) here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    rows = []
    for lf in args.load_factors:
        fresh = Fresh(int(lf * 1000) + 1)
        table = ScoredHashTable(
            [args.capacity], bucket_capacities=args.bucket_capacity, max_load_factor=1.0
        )
        t0 = time.perf_counter()
        resident = prefill(table, fresh, lf)
        fill_s = time.perf_counter() - t0
        real_lf = float(table.load_factor()[0])
        print(
            f"# load factor {lf}: {resident.numel()} keys resident ({real_lf:.4f}), "
            f"pre-fill {fill_s:.1f} s",
            file=sys.stderr,
        )
        results = {"table": (bench_table(table, resident, fresh, args.batch, args.reps), threads)}
        if not args.no_baselines:
            results["dict"] = (bench_dict(resident, fresh, args.batch, args.reps), 1)
            results["sorted"] = (bench_sorted(resident, fresh, args.batch, args.reps), threads)
        del table
        for op in ("find", "insert", "insert_and_evict"):
            base = results.get("dict", ({}, 1))[0].get(op)
            for impl, (res, th) in results.items():
                if op not in res:
                    continue
                rate = args.batch / res[op]
                speed = f"{base / res[op]:.1f}x" if base else "-"
                rows.append((op, f"{real_lf:.2f}", impl, th, fmt(rate), fmt(rate / th), speed))

    header = (
        "operation",
        "load factor",
        "implementation",
        "threads",
        "keys/s",
        "keys/s per core",
        "vs dict (wall)",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    table_md = "\n".join(lines)
    print(table_md)

    if args.write:
        py = os.path.relpath(sys.executable)
        py = "python" if py.startswith("..") else py
        cmd = " ".join(shlex.quote(a) for a in [py, os.path.relpath(sys.argv[0])] + sys.argv[1:])
        doc = [
            "# Scored hash table: CPU throughput",
            "",
            "Produced by `tools/bench/table_cpu_bench.py` (its docstring says what each row",
            f"times). One batch of {args.batch:,} keys per operation on a table of",
            f"{args.capacity:,} slots (buckets of {args.bucket_capacity}, one score word),",
            "pre-filled with random keys to the load factor shown; median of",
            f"{args.reps} repetitions, each on a fresh copy of the pre-filled table and a",
            "fresh batch. Per-core figures divide by the threads used.",
            "",
            f"Machine: {cpu_model()}, nproc = {os.cpu_count()}; torch {torch.__version__} with",
            f"{threads} threads; Python {platform.python_version()}. One-minute load average",
            f"{load_before:.2f} before the run and {os.getloadavg()[0]:.2f} after"
            + (
                ": other processes shared the cores, so the absolute figures are on the low side."
                if max(load_before, os.getloadavg()[0]) > 0.5
                else "."
            ),
            "",
            "Command (from the repository root):",
            "",
            "```",
            cmd,
            "```",
            "",
            table_md,
            "",
            "Notes:",
            "",
            "- `insert` at load factor 1.0 places nothing: every bucket is full, so every key",
            "  is probed, found absent and reported FAILED.",
            "- The dict baseline runs on one core and never fails or evicts by score; its",
            "  eviction row deletes an arbitrary resident key per new key.",
            "- The sorted baseline has no eviction; its insert re-sorts all keys.",
            "- On a shared machine compare rows of one run (same conditions), not runs.",
            "",
        ]
        # The one-bucket section (tools/bench/one_bucket_bench.py) is kept as it is.
        tail = ""
        if os.path.exists(args.write):
            with open(args.write) as f:
                old = f.read()
            at = old.find(ONE_BUCKET_SECTION)
            tail = old[at:] if at >= 0 else ""
        with open(args.write, "w") as f:
            f.write("\n".join(doc) + ("\n" + tail if tail else ""))
        print(f"# wrote {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
