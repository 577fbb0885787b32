"""GPU throughput of the scored hash table, the way published GPU hash-table
benchmarks measure it: one batch of 1,048,576 keys per operation, on a table
pre-filled to a load factor, fp32 values of a given dim copied in or out.

    python tools/bench/table_gpu_bench.py [--dims 8 32 64] [--load-factors 0.5 0.75 1.0]
    python tools/bench/table_gpu_bench.py --run-lanes 1 0 4 8 16 32 [--dims 32 64]

Prints a markdown table in billions of keys per second, with, from the same
run, a plain PyTorch baseline (sorted keys + searchsorted + index_select) and
the device copy bandwidth as the floor. Finds and the baseline are timed over
BACK_TO_BACK calls in a row (the host prepares the next call while the device
runs this one, as in a training loop); finds also one call at a time (the
host's launch latency included), as inserts are.

With --run-lanes, the inserts alone under each value of DEMB_CUDA_RUN_LANES
(read once per process, so each in a process of its own, one after another
on the same device): 1 the thread per run with victim hints (the earlier
kernel), 4, 8, 16 or 32 lanes of a tile per run, 0 the tiles' default; then one
table of insert_and_evict and insert side by side, with HierarchicalKV's
figures at the same dim and load factor beside them (HKV_POINTS).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

from dynamicemb.table import ScoredHashTable, enums

BATCH = 1 << 20
BACK_TO_BACK = 10
OPS = ("find", "insert", "insert_and_evict", "baseline")

# HierarchicalKV's insert_and_evict (its own benchmark, LRU, fp32 values), B
# keys/s, by (dim, load factor): (figure, where it comes from).
HKV_POINTS = {
    (32, 0.5): (1.52, "H100 NVL, HKV's published figures, 128M keys"),
    (8, 0.5): (1.81, "H200, measured with HKV's benchmark"),
    (8, 0.75): (1.86, "H200, measured with HKV's benchmark"),
    (8, 1.0): (0.81, "H200, measured with HKV's benchmark"),
    (64, 0.5): (1.48, "H200, measured with HKV's benchmark"),
    (64, 0.75): (1.42, "H200, measured with HKV's benchmark"),
    (64, 1.0): (0.77, "H200, measured with HKV's benchmark"),
}


def timed(fn, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def timed_calls(fn, reps, calls=BACK_TO_BACK):
    """Seconds per call of `calls` calls in a row (median of reps)."""

    def run():
        for _ in range(calls):
            fn()

    return timed(run, reps) / calls


def copy_bandwidth():
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
    y = torch.empty_like(x)
    y.copy_(x)
    t = timed(lambda: y.copy_(x), 10)
    return 2 * x.numel() * 4 / t


class Fresh:
    """Distinct random keys, never repeated across calls."""

    def __init__(self, seed):
        self.g = torch.Generator(device="cuda").manual_seed(seed)
        self.base = 0

    def __call__(self, n):
        # Disjoint ranges of 2**40 keys per call keep keys unique without a set.
        k = torch.randint(0, 1 << 40, (n,), device="cuda", generator=self.g) + self.base
        self.base += 1 << 40
        return k


def bench_dim(dim, capacity, load_factors, reps, out, ops=OPS):
    table = ScoredHashTable([capacity], bucket_capacities=128, device="cuda", validate=False)
    # Rows past `capacity` take the writes of keys that got no slot (one row
    # each, so a failed insert costs what a stored one does).
    values = torch.empty((capacity + BATCH, dim), dtype=torch.float32, device="cuda")
    spare = torch.arange(capacity, capacity + BATCH, device="cuda")
    fresh = Fresh(dim)
    ts = [0]
    policy = [enums.ScorePolicy.ASSIGN]
    resident = []

    def insert_batch(keys, evict):
        ts[0] += 1
        op = table.insert_and_evict if evict else table.insert
        res = op(keys, policies=policy, scores=ts[0])
        ok = res.slots >= 0
        values.index_copy_(0, res.slots[ok], torch.ones((int(ok.sum()), dim), device="cuda"))
        return res

    filled = 0
    for lf in load_factors:
        target = int(lf * capacity)
        while filled < target:
            n = min(BATCH, target - filled)
            k = fresh(n)
            insert_batch(k, evict=True)
            resident.append(k)
            filled += n
        torch.cuda.synchronize()
        size = int(table.size()[0])
        probe = torch.cat(resident[-8:])[-BATCH:]
        out_buf = torch.empty((BATCH, dim), dtype=torch.float32, device="cuda")

        def find():
            return table.find_gather(probe, values)

        nan = float("nan")
        t_find_one = timed(find, reps) if "find" in ops else nan
        t_find = timed_calls(find, reps) if "find" in ops else nan

        # insert / insert_and_evict of new keys with their values written.
        batches = [fresh(BATCH) for _ in range(reps)]
        it = iter(batches)
        vals = torch.ones((BATCH, dim), device="cuda")

        def upsert(evict):
            res = (table.insert_and_evict if evict else table.insert)(
                next(it), policies=policy, scores=ts[0] + 1
            )
            values.index_copy_(0, torch.where(res.slots >= 0, res.slots, spare), vals)

        # Each timed batch runs on the table as it was, so the load factor stays
        # what it claims: save the state, restore it after each measurement.
        saved = [t.clone() for t in (table.keys, table.digests, table.scores, table.counters)]

        def restore():
            for dst, src in zip((table.keys, table.digests, table.scores, table.counters), saved):
                dst.copy_(src)

        t_ins = t_ie = nan
        if "insert" in ops:
            t_ins = timed(lambda: upsert(False), reps)
            restore()
        if "insert_and_evict" in ops:
            it = iter([fresh(BATCH) for _ in range(reps)])
            t_ie = timed(lambda: upsert(True), reps)
            restore()
        saved.clear()

        # Baseline: sorted keys + searchsorted + index_select on the same keys.
        sorted_keys, perm = torch.sort(torch.cat(resident)[:size])
        base_vals = values[:size]

        def base_find():
            pos = torch.searchsorted(sorted_keys, probe).clamp(max=size - 1)
            hit = sorted_keys[pos] == probe
            torch.index_select(base_vals, 0, perm[pos], out=out_buf)
            return hit

        t_base = timed_calls(base_find, reps) if "baseline" in ops else nan
        out.append(
            (
                dim,
                capacity,
                lf,
                size / capacity,
                BATCH / t_find / 1e9,
                BATCH / t_find_one / 1e9,
                BATCH / t_ins / 1e9,
                BATCH / t_ie / 1e9,
                BATCH / t_base / 1e9,
            )
        )
        print(
            f"dim {dim} lf {lf}: find {BATCH / t_find / 1e9:.3f} B/s "
            f"(one call {BATCH / t_find_one / 1e9:.3f}), "
            f"insert {BATCH / t_ins / 1e9:.3f} B/s, "
            f"insert_and_evict {BATCH / t_ie / 1e9:.3f} B/s, "
            f"baseline find {BATCH / t_base / 1e9:.3f} B/s",
            flush=True,
        )


def compare_run_lanes(args):
    """The inserts under each DEMB_CUDA_RUN_LANES value, each in a process of
    its own, and one table of them with HierarchicalKV's figures."""
    runs = {}
    for lanes in args.run_lanes:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, os.path.abspath(__file__), "--json", f.name, "--ops"]
            cmd += ["insert", "insert_and_evict", "--reps", str(args.reps)]
            cmd += ["--capacity-log2", str(args.capacity_log2), "--dims"]
            cmd += [str(d) for d in args.dims] + ["--load-factors"]
            cmd += [str(lf) for lf in args.load_factors]
            env = dict(os.environ, DEMB_CUDA_RUN_LANES=str(lanes))
            print(f"== DEMB_CUDA_RUN_LANES={lanes}", flush=True)
            subprocess.run(cmd, env=env, check=True)
            with open(f.name) as fh:
                runs[lanes] = {(r["dim"], r["load_factor"]): r for r in json.load(fh)}
    names = {1: "thread per run (1)", 0: "default (by keys a bucket)"}
    heads = [names.get(lanes, f"tile of {lanes}") for lanes in args.run_lanes]
    base = args.run_lanes[0]
    for op in ("insert_and_evict", "insert"):
        print(f"\n{op}, B keys/s (ratio to {names.get(base, base)} in the same run)\n")
        hkv = op == "insert_and_evict"
        tail = " | HierarchicalKV |" if hkv else " |"
        print("| dim | load factor | " + " | ".join(heads) + tail)
        print("|---|---|" + "---|" * (len(heads) + (1 if hkv else 0)))
        for dim in args.dims:
            for lf in args.load_factors:
                row = [runs[lanes][(dim, lf)] for lanes in args.run_lanes]
                real = row[0]["real_load_factor"]
                cells = [f"{r[op]:.3f} ({r[op] / row[0][op]:.2f}x)" for r in row]
                line = f"| {dim} | {lf} ({real:.3f}) | " + " | ".join(cells) + " |"
                if hkv:
                    point = HKV_POINTS.get((dim, lf))
                    line += f" {point[0]:.2f} ({point[1]}) |" if point else " - |"
                print(line)
    print(
        "\ntargets (insert_and_evict): 1.5 B keys/s at dim 32 and load 0.5 on an H100 "
        "(1.8 at dim 64 on an H200), 0.8 at load 1.0"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75, 1.0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument(
        "--capacity-log2", type=int, default=27, help="dims below 64; dim 64 uses one less"
    )
    ap.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="what to time")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--run-lanes",
        type=int,
        nargs="+",
        help="time the inserts under each DEMB_CUDA_RUN_LANES value (1: the earlier kernel)",
    )
    args = ap.parse_args()
    print(torch.cuda.get_device_name(0), "torch", torch.__version__)
    if args.run_lanes:
        compare_run_lanes(args)
        return
    bw = copy_bandwidth() if "find" in args.ops else float("nan")
    print(f"device copy bandwidth (read + write): {bw / 1e12:.2f} TB/s")
    rows = []
    for dim in args.dims:
        cap = 1 << (args.capacity_log2 - (1 if dim >= 64 else 0))
        bench_dim(dim, cap, args.load_factors, args.reps, rows, args.ops)
        torch.cuda.empty_cache()
    if args.json:
        keys = ("dim", "capacity", "load_factor", "real_load_factor", "find", "find_one_call")
        keys += ("insert", "insert_and_evict", "baseline")
        with open(args.json, "w") as f:
            json.dump([dict(zip(keys, r)) for r in rows], f)
    print()
    print(
        "| dim | capacity | load factor | find B/s | find, one call B/s | insert B/s | "
        "insert_and_evict B/s | torch sorted find B/s | find floor B/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for dim, cap, lf, real_lf, f, f1, ins, ie, b in rows:
        # Floor for find: keys in (8 B), digests (128 B line) + key (8 B) + value read + write.
        bytes_per_key = 8 + 128 + 8 + 2 * 4 * dim + 8
        print(
            f"| {dim} | {cap:,} | {lf} ({real_lf:.3f}) | {f:.3f} | {f1:.3f} | {ins:.3f} | {ie:.3f} "
            f"| {b:.3f} "
            f"| {bw / bytes_per_key / 1e9:.2f} |"
        )


if __name__ == "__main__":
    main()
