"""A short demonstration of the scored hash table alone (the main job,
examples/train_dlrm.py, trains a model on it).

Streams batches of power-law distributed 64-bit ids through a table that is
too small for them: every batch is a find-or-insert scored by the step
(STEP strategy), full buckets evict their least recently used key, and the
device counters report size, evictions and insert failures. Runs on the GPU
when there is one, else on the CPU.

    python examples/demo_table.py [--steps 200] [--batch 65536] [--capacity 262144]
"""

import argparse
import time

import torch

from dynamicemb.table import ScoredHashTable, enums


def power_law_ids(g, n, vocab, alpha, device):
    """Ids with P(rank r) ~ r^-alpha over `vocab` ranks, scattered over int64."""
    u = torch.rand(n, generator=g, dtype=torch.float64).to(device)
    # Inverse CDF of a continuous power law on [1, vocab].
    a = 1.0 - alpha
    ranks = ((vocab**a - 1.0) * u + 1.0) ** (1.0 / a)
    ranks = ranks.to(torch.int64)
    return ranks * 0x9E3779B97F4A7C15 % (2**62)  # spread the ranks over the key space


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--capacity", type=int, default=1 << 18)
    ap.add_argument("--vocab", type=int, default=1 << 24)
    ap.add_argument("--alpha", type=float, default=1.05)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    device = torch.device(args.device)
    table = ScoredHashTable([args.capacity], bucket_capacities=128, device=device, validate=False)
    g = torch.Generator().manual_seed(0)
    print(
        f"scored hash table on {device}: capacity {args.capacity:,}, buckets of 128, "
        f"{args.steps} steps of {args.batch:,} power-law ids (alpha {args.alpha})"
    )
    found = 0
    total = 0
    start = time.perf_counter()
    width = 30
    for step in range(1, args.steps + 1):
        keys = power_law_ids(g, args.batch, args.vocab, args.alpha, device)
        uniq = torch.unique(keys)
        res = table.insert_and_evict(uniq, policies=[enums.ScorePolicy.ASSIGN], scores=step)
        found += int((res.status == enums.InsertStatus.FOUND).sum())
        total += uniq.numel()
        if step % max(1, args.steps // 20) == 0 or step == args.steps:
            done = step * width // args.steps
            lf = float(table.load_factor()[0])
            print(
                f"\r[{'#' * done}{'.' * (width - done)}] step {step}/{args.steps} "
                f"load {lf:.3f} hit rate {found / total:.3f}",
                end="",
                flush=True,
            )
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    print()
    size = int(table.size()[0])
    print(f"done in {elapsed:.2f} s: {total / elapsed / 1e6:.2f} M unique keys/s")
    print(
        f"keys stored {size:,} (count from slots {int(table.count()[0]):,}), "
        f"inserted {int(table.counter('INSERTS')[0]):,}, "
        f"evicted {int(table.counter('EVICTIONS')[0]):,}, "
        f"insert failures {int(table.counter('INSERT_FAILURES')[0]):,}"
    )
    recent = table.export_batch(threshold=args.steps).compact()
    print(f"keys touched in the last step: {int(recent.count):,}")


if __name__ == "__main__":
    main()
