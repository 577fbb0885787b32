"""Train-step time of BatchedDynamicEmbeddingTablesV2 with its metrics scraped
every second against no metrics collection.

    python tools/bench/metrics_bench.py [--device cuda] [--tables 10] [--lookups 104857]
        [--dim 128] [--rows 1677721] [--seconds 5] [--rounds 6] [--interval 1.0]

The module is instrumented (dynamicemb.metrics) with an OpenTelemetry SDK
MeterProvider and a Prometheus endpoint (serve_prometheus). Blocks of
``--seconds`` alternate, ``--rounds`` of each, in the order off-on, on-off,
off-on, ... (so a drift of the machine's speed cancels): "off", where nothing
collects, and "on", where a scraper in a separate process fetches /metrics every
``--interval`` seconds, as a Prometheus server would. Without collections the
instruments are never called, so "off" is the step as it runs without an SDK.
One step = forward + backward + optimizer update (SGD), keys drawn from a
power law (exponent 1.05) over ``rows`` ids per table, hotness 1; every step
is timed alone (synchronized on CUDA). Prints, as a markdown row: the mean
and median step time of each mode and their difference; the process's CPU
time (all threads, the endpoint's included) per step of each mode, which a
busy machine disturbs less than wall time; the scrapes served per second; and
the time and CPU time of one scrape (50 fetched from this process after the
blocks, the client's side included: at most what a scrape costs the training
process, once per interval).
"""

import argparse
import statistics
import subprocess
import sys
import time
import urllib.request

import torch
from embedding_bench import power_law  # tools/bench/embedding_bench.py, next to this script

from dynamicemb import DynamicEmbTableOptions
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.metrics import instrument, serve_prometheus

SCRAPER = """
import sys, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic()
while True:
    with urllib.request.urlopen(url, timeout=30) as r:
        r.read()
    print("scraped", flush=True)
    deadline += interval
    time.sleep(max(0.0, deadline - time.monotonic()))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--lookups", type=int, default=8192, help="keys per table and step")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rows", type=int, default=200000, help="distinct ids per table")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one block")
    ap.add_argument("--rounds", type=int, default=6, help="blocks of each mode")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument("--batches", type=int, default=16, help="distinct batches cycled through")
    args = ap.parse_args()

    dev = torch.device(args.device)
    T, N = args.tables, args.lookups
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.cat([power_law(g, N, args.rows, 1.05) for _ in range(T)]).to(dev)
        for _ in range(args.batches)
    ]
    offsets = torch.arange(T * N + 1, device=dev)
    cap = 1 << (2 * args.rows - 1).bit_length()
    opts = [
        DynamicEmbTableOptions(dim=args.dim, max_capacity=cap, bucket_capacity=128)
        for _ in range(T)
    ]
    module = BatchedDynamicEmbeddingTablesV2(opts, None, device=dev, learning_rate=0.1)

    def step(i: int) -> None:
        module(batches[i % len(batches)], offsets).sum().backward()

    for i in range(len(batches)):  # pre-fill: every key of the timed steps exists
        step(i)

    endpoint = serve_prometheus(0, "127.0.0.1", set_global=False)
    registry = instrument(module, meter_provider=endpoint.meter_provider)
    url = f"http://127.0.0.1:{endpoint.port}/metrics"
    times: dict[str, list[float]] = {"off": [], "on": []}
    cpu = {"off": 0.0, "on": 0.0}
    scrapes = 0
    i = 0
    try:
        for r in range(args.rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                scraper = None
                if mode == "on":
                    scraper = subprocess.Popen(
                        [sys.executable, "-c", SCRAPER, url, str(args.interval)],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    scraper.stdout.readline()  # the first scrape is served
                reads = registry.reads
                cpu0 = time.process_time()
                end = time.perf_counter() + args.seconds
                while time.perf_counter() < end:
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    step(i)
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    times[mode].append(time.perf_counter() - t0)
                    i += 1
                cpu[mode] += time.process_time() - cpu0
                if scraper is not None:
                    scraper.terminate()
                    scraper.wait()
                    scrapes += registry.reads - reads
                elif registry.reads != reads:
                    raise RuntimeError("a collection ran in an 'off' block")
        scrape_times = []
        cpu0 = time.process_time()
        for _ in range(50):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as r:
                r.read()
            scrape_times.append(time.perf_counter() - t0)
        scrape_cpu_ms = (time.process_time() - cpu0) / 50 * 1e3
        scrape_ms = statistics.median(scrape_times) * 1e3
    finally:
        endpoint.shutdown()

    mean = {m: statistics.fmean(v) * 1e3 for m, v in times.items()}
    median = {m: statistics.median(v) * 1e3 for m, v in times.items()}
    cpu_ms = {m: cpu[m] / len(times[m]) * 1e3 for m in times}
    seconds_on = args.rounds * args.seconds
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(
        f"{name}: {T} tables x {N} keys, dim {args.dim}, {args.rows:,} ids per table; "
        f"{args.rounds} blocks of {args.seconds} s per mode, a scrape every {args.interval} s"
    )
    print(
        "| device | steps off / on | mean ms off | mean ms on | mean diff | median ms off "
        "| median ms on | median diff | CPU ms off | CPU ms on | CPU diff | scrapes / s "
        "| ms per scrape | CPU ms per scrape |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {name} | {len(times['off'])} / {len(times['on'])} | {mean['off']:.3f} | "
        f"{mean['on']:.3f} | {100 * (mean['on'] / mean['off'] - 1):+.2f} % | "
        f"{median['off']:.3f} | {median['on']:.3f} | "
        f"{100 * (median['on'] / median['off'] - 1):+.2f} % | {cpu_ms['off']:.3f} | "
        f"{cpu_ms['on']:.3f} | {100 * (cpu_ms['on'] / cpu_ms['off'] - 1):+.2f} % | "
        f"{scrapes / seconds_on:.2f} | {scrape_ms:.2f} | {scrape_cpu_ms:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
