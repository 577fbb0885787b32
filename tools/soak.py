"""Soak run of the main job: examples/train_dlrm.py for many steps with the small
tables evicting all along, checking every rank's table counters every
``--every`` steps (train_dlrm.py --soak-every) and recording rank 0's host
RSS and device memory. Passes when

  * every counter check held (rows held = occupied slots = inserts - evictions,
    within capacity, cumulative counters never decreasing);
  * a table that evicts evicted in every interval between samples from its
    first eviction on;
  * host RSS and device memory are flat after the warm-up (the first
    ``--warmup`` share of the samples): the highest later sample exceeds the
    one at the end of the warm-up by at most ``--rss-slack-mb`` (host) and
    ``--device-slack-mb`` (device).

Prints the figures as markdown (for docs/benchmarks/soak.md) and exits 1 on
a failed check. The other arguments go to train_dlrm.py, e.g.

    OMP_NUM_THREADS=1 taskset -c 1 python tools/soak.py --steps 100000 \\
        --every 2000 -- --device cpu --world-size 1 --batch-size 32
    python tools/soak.py --steps 100000 --every 2000 -- --device cuda
"""

import argparse
import json
import os
import sys
import tempfile
import time

# The main job, examples/train_dlrm.py (which imports the modules beside it by name).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import train_dlrm


def judge(summary: dict, warmup: float, rss_slack: float, dev_slack: float) -> tuple[list, dict]:
    """(failed checks, figures) of a soak summary."""
    samples = summary["soak"]["samples"]
    failures = []
    if len(samples) < 4:
        failures.append(f"only {len(samples)} samples: run more steps or sample more often")
        return failures, {}
    w = max(1, int(len(samples) * warmup))
    base, after = samples[w - 1], samples[w:]
    fig = {
        "steps": summary["steps"],
        "samples": len(samples),
        "warmup_step": base[0],
        "rss_mb_start": samples[0][1],
        "rss_mb_warm": base[1],
        "rss_mb_max_after": max(s[1] for s in after),
        "rss_mb_end": samples[-1][1],
        "dev_alloc_mb_warm": base[2],
        "dev_alloc_mb_max_after": max(s[2] for s in after),
        "dev_reserved_mb_warm": base[3],
        "dev_reserved_mb_max_after": max(s[3] for s in after),
        "seconds": summary["seconds"],
        "steps_per_s": summary["steps_per_s"],
        "tables": samples[-1][4],
    }
    if fig["rss_mb_max_after"] - fig["rss_mb_warm"] > rss_slack:
        failures.append(
            f"host RSS grew from {fig['rss_mb_warm']} MiB (step {base[0]}) to "
            f"{fig['rss_mb_max_after']} MiB (slack {rss_slack} MiB)"
        )
    for what in ("alloc", "reserved"):
        grew = fig[f"dev_{what}_mb_max_after"] - fig[f"dev_{what}_mb_warm"]
        if grew > dev_slack:
            failures.append(f"device memory ({what}) grew by {grew:.1f} MiB (slack {dev_slack})")
    # A table that evicts keeps evicting: in every interval from its first eviction on.
    evicting = [n for n, v in samples[-1][4].items() if v[2] > 0]
    for name in evicting:
        first = next(i for i, s in enumerate(samples) if s[4][name][2] > 0)
        for a, b in zip(samples[first:], samples[first + 1 :]):
            if b[4][name][2] <= a[4][name][2]:
                failures.append(f"table {name} did not evict between steps {a[0]} and {b[0]}")
    fig["evicting_tables"] = evicting
    return failures, fig


def markdown(fig: dict, argv: list[str]) -> str:
    lines = [
        f"`python tools/soak.py {' '.join(argv)}`",
        "",
        f"{fig['steps']:,} steps in {fig['seconds'] / 60:.1f} min ({fig['steps_per_s']:.1f} "
        f"steps/s), {fig['samples']} samples; warm-up ends at step {fig['warmup_step']:,}.",
        "",
        "| | start | end of warm-up | highest after | end |",
        "|---|---|---|---|---|",
        f"| host RSS (MiB) | {fig['rss_mb_start']} | {fig['rss_mb_warm']} | "
        f"{fig['rss_mb_max_after']} | {fig['rss_mb_end']} |",
        f"| device allocated (MiB) | | {fig['dev_alloc_mb_warm']} | "
        f"{fig['dev_alloc_mb_max_after']} | |",
        f"| device reserved (MiB) | | {fig['dev_reserved_mb_warm']} | "
        f"{fig['dev_reserved_mb_max_after']} | |",
        "",
        "| table (rank 0) | rows held | inserts | evictions | insert failures |",
        "|---|---|---|---|---|",
    ]
    for name, (size, inserts, evictions, failures) in fig["tables"].items():
        lines.append(f"| {name} | {size:,} | {inserts:,} | {evictions:,} | {failures:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=2000, help="steps between samples")
    ap.add_argument("--warmup", type=float, default=0.1, help="share of samples that warm up")
    ap.add_argument("--rss-slack-mb", type=float, default=32.0)
    ap.add_argument("--device-slack-mb", type=float, default=1.0)
    ap.add_argument("--summary-json", help="keep train_dlrm's summary (with the samples) here")
    ap.add_argument("job_args", nargs="*", help="train_dlrm.py arguments (after --)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.summary_json or os.path.join(tmp, "summary.json")
        start = time.time()
        rc = train_dlrm.main(
            [
                "--steps",
                str(a.steps),
                "--soak-every",
                str(a.every),
                "--no-count-distinct",
                "--summary-json",
                path,
                *a.job_args,
            ]
        )
        with open(path) as f:
            summary = json.load(f)
    failures, fig = judge(summary, a.warmup, a.rss_slack_mb, a.device_slack_mb)
    if rc != 0:
        failures.append("the training loss did not fall")
    print(f"\nsoak: {time.time() - start:.0f} s wall")
    if fig:
        print(markdown(fig, argv))
        print(json.dumps(fig))
    for f in failures:
        print("soak: FAILED:", f)
    if not failures:
        print("soak: passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
