"""Draws the tables' figures over a training run from Prometheus's answers.

    python tools/metrics_picture.py [--out docs/images/metrics_run.png] [--steps 1500]
        [-- extra examples/train_dlrm.py arguments]
    python tools/metrics_picture.py --prometheus http://host:9090 --start T0 --end T1

The first form starts a Prometheus server of its own (tools/prometheus_server.py,
scrape interval 0.5 s), runs the main job with --metrics-port on the CPU (two
gloo processes), and asks Prometheus for the figures of the run. The second
plots a run that an existing Prometheus holds (times in Unix seconds).

Needs matplotlib (`pip install matplotlib`), which nothing else in the project uses.
"""

import argparse
import os
import sys
import time

# The main job, examples/train_dlrm.py, and its dist_launch.py; the Prometheus
# harness, tools/prometheus_server.py, is next to this script.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import dist_launch
import train_dlrm
from prometheus_server import PrometheusServer

SCRAPE = 0.5  # seconds

# (title, PromQL, y label); {w} is the rate window. Sums over ranks, per table.
PANELS = [
    ("Rows held (solid) and capacity (dashed)", None, "rows"),
    (
        "Load factor",
        "max by (dynamicemb_table_name) (dynamicemb_table_load_factor_ratio)",
        "keys / slots",
    ),
    (
        "Lookups",
        "sum by (dynamicemb_table_name) (rate(dynamicemb_table_lookups_total[{w}]))",
        "distinct keys / s",
    ),
    (
        "Inserts",
        "sum by (dynamicemb_table_name) (rate(dynamicemb_table_inserts_total[{w}]))",
        "keys / s",
    ),
    (
        "Evictions",
        "sum by (dynamicemb_table_name) (rate(dynamicemb_table_evictions_total[{w}]))",
        "keys / s",
    ),
    (
        "Insert failures (cumulative)",
        "sum by (dynamicemb_table_name) (dynamicemb_table_insert_failures_total)",
        "keys",
    ),
    (
        "Memory (host)",
        "sum by (dynamicemb_table_name) "
        '(dynamicemb_memory_usage_bytes{dynamicemb_memory_type="host"})',
        "MiB",
    ),
]
USAGE = "sum by (dynamicemb_table_name) (dynamicemb_table_usage)"
LIMIT = "sum by (dynamicemb_table_name) (dynamicemb_table_limit)"


def run_job(base_port: int, world_size: int, steps: int, extra: list[str]) -> None:
    argv = (
        f"--device cpu --world-size {world_size} --steps {steps} --no-count-distinct "
        f"--metrics-port {base_port} --metrics-address 127.0.0.1 --metrics-wait 30".split()
        + extra
    )
    print("running: train_dlrm.py", " ".join(argv), flush=True)
    summary, out = train_dlrm.launch(argv)
    print(out)
    if summary is None:
        raise RuntimeError("the main job failed")


def plot(prom: PrometheusServer, start: float, end: float, out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = SCRAPE
    window = f"{int(4 * SCRAPE * 1000)}ms"
    # The span in which every rank served its tables (the job starts up before
    # and the ranks come and go one after the other): time 0 is its start.
    ranks = prom.query_range("max by (dynamicemb_rank) (dynamicemb_table_usage)", start, end, step)
    if not ranks:
        raise RuntimeError(f"Prometheus at {prom.url} holds no dynamicemb figures in that time")
    t0 = max(values[0][0] for _, values in ranks)
    start, end = t0, min(values[-1][0] for _, values in ranks)
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5), constrained_layout=True)
    colors: dict[str, str] = {}

    def color(name: str) -> str:
        return colors.setdefault(name, f"C{len(colors)}")

    def series(promql: str):
        for labels, values in sorted(
            prom.query_range(promql, start, end, step),
            key=lambda s: s[0].get("dynamicemb_table_name", ""),
        ):
            name = labels.get("dynamicemb_table_name", "")
            yield name, [t - t0 for t, _ in values], [v for _, v in values]

    for ax, (label, promql, unit) in zip(axes.flat, PANELS):
        ax.set_title(label, fontsize=11)
        ax.set_xlabel("seconds")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if promql is None:
            for name, ts, vs in series(USAGE):
                ax.plot(ts, vs, color=color(name), label=name)
            for name, ts, vs in series(LIMIT):
                ax.plot(ts, vs, color=color(name), linestyle="--")
            ax.set_yscale("log")
            ax.legend(fontsize=9)
            continue
        scale = 1 / 2**20 if unit == "MiB" else 1
        for name, ts, vs in series(promql.replace("{w}", window)):
            ax.plot(ts, [v * scale for v in vs], color=color(name), label=name)
        ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
    last = axes.flat[-1]
    last.axis("off")
    last.text(
        0.0,
        0.95,
        "Not in this run (no data until they are counted):\n"
        "  dynamicemb.table.admissions, .rejections\n"
        "    (admission)\n"
        "  dynamicemb.cache.hits, .misses\n"
        "    (a cache tier)\n\n"
        "Sums over the ranks, per table;\n"
        "rates over 2 s windows; time 0 is\n"
        "the first scrape of every rank.",
        va="top",
        fontsize=10,
        family="monospace",
    )
    fig.suptitle(title, fontsize=12)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=80)
    print("wrote", out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/images/metrics_run.png")
    ap.add_argument("--steps", type=int, default=1500, help="steps of the main job")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--prometheus", default=None, help="plot from this Prometheus (URL)")
    ap.add_argument("--start", type=float, default=None, help="with --prometheus: Unix seconds")
    ap.add_argument("--end", type=float, default=None, help="with --prometheus: Unix seconds")
    ap.add_argument("job_args", nargs="*", help="more arguments of examples/train_dlrm.py")
    args = ap.parse_args()
    if args.prometheus:
        if args.start is None or args.end is None:
            ap.error("--prometheus needs --start and --end")
        prom = PrometheusServer([])
        prom.url = args.prometheus.rstrip("/")
        plot(prom, args.start, args.end, args.out, f"dynamicemb figures from {args.prometheus}")
        return 0
    base = dist_launch.free_ports(args.world_size)
    targets = [f"127.0.0.1:{base + r}" for r in range(args.world_size)]
    with PrometheusServer(targets, scrape_interval=f"{int(SCRAPE * 1000)}ms") as prom:
        start = time.time()
        run_job(base, args.world_size, args.steps, args.job_args)
        prom.wait_until_down()
        end = time.time()
        plot(
            prom,
            start,
            end,
            args.out,
            f"The main job (examples/train_dlrm.py, {args.steps} steps, "
            f"{args.world_size} CPU ranks) as Prometheus scraped it every {SCRAPE} s",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
