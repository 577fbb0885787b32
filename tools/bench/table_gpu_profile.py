"""Per-kernel GPU time of find and insert_and_evict (torch.profiler), to see
where the time of a table operation goes.

    python tools/bench/table_gpu_profile.py [--capacity-log2 27] [--load-factor 0.5]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from dynamicemb.table import ScoredHashTable, enums, gather_rows

BATCH = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity-log2", type=int, default=27)
    ap.add_argument("--load-factor", type=float, default=0.5)
    ap.add_argument("--dim", type=int, default=32)
    args = ap.parse_args()
    cap = 1 << args.capacity_log2
    t = ScoredHashTable([cap], bucket_capacities=128, device="cuda", validate=False)
    values = torch.zeros((cap, args.dim), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    filled, step = 0, 0
    last = None
    while filled < int(args.load_factor * cap):
        last = torch.randint(0, 2**62, (BATCH,), device="cuda", generator=g)
        t.insert_and_evict(last, policies=[enums.ScorePolicy.ASSIGN], scores=step)
        filled += BATCH
        step += 1
    new = [torch.randint(0, 2**62, (BATCH,), device="cuda", generator=g) for _ in range(5)]
    out = torch.empty((BATCH, args.dim), device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for k in new:
            _, out = t.find_gather(last, values)
            gather_rows(values, t.find(last))  # the unfused pair, for comparison
            r = t.insert_and_evict(k, policies=[enums.ScorePolicy.ASSIGN], scores=step)
            values.index_copy_(0, r.slots.clamp(min=0), out)
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
    )


if __name__ == "__main__":
    main()
