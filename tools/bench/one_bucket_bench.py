"""One bucket per table (``MAX_BUCKET_CAPACITY``): CPU time of batches into a
full table whose single bucket spans all its n slots, for growing n.

    python tools/bench/one_bucket_bench.py [--sizes 1024 2048 ... 65536] [--reps 3]

For each n the table is filled with n keys (TIMER scores, so they tie), then
two batches are timed, each on a fresh copy of the full table:

  new        insert_and_evict of n new keys: every key evicts one
  training   insert_and_evict of n keys, half resident and half new, shuffled
             (what a training step sends): the resident half is found, the
             new half evicts the untouched keys

The fastest of the repetitions: on a shared machine the others measure the
preemptions. A batch of n keys into one bucket of n slots costs
O(n log n) (one pass over the bucket to index it and to select the victims):
the time per key grows with log n, not with n.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from dynamicemb.table import ScoredHashTable, enums


def timed(table: ScoredHashTable, keys: torch.Tensor, reps: int) -> float:
    saved = [x.clone() for x in (table.keys, table.digests, table.scores, table.counters)]
    times = []
    for _ in range(reps):
        for dst, src in zip((table.keys, table.digests, table.scores, table.counters), saved):
            dst.copy_(src)
        t0 = time.perf_counter()
        res = table.insert_and_evict(keys, policies=[enums.ScorePolicy.TIMER])
        times.append(time.perf_counter() - t0)
    assert int(res.evicted.count) > 0
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << k for k in range(10, 17)])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print("| n (slots = batch) | new: s | new: keys/s | training: s | training: keys/s |")
    print("|---|---|---|---|---|")
    for n in args.sizes:
        t = ScoredHashTable([n], bucket_capacities=None, max_load_factor=1.0)
        resident = torch.arange(1, n + 1)
        t.insert(resident, policies=[enums.ScorePolicy.TIMER])
        assert int(t.size()[0]) == n
        new = torch.arange(n + 1, 2 * n + 1)
        mixed = torch.cat([resident[: n // 2], new[: n - n // 2]])
        mixed = mixed[torch.randperm(n, generator=g)]
        a, b = timed(t, new, args.reps), timed(t, mixed, args.reps)
        print(f"| {n:,} | {a:.4f} | {n / a / 1e6:.2f} M | {b:.4f} | {n / b / 1e6:.2f} M |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
