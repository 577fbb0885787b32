"""Checkpoint throughput: DynamicEmbDump / DynamicEmbLoad against writing and
reading the same bytes plainly, in one run.

One process (a world of one: NCCL on the GPU, gloo on the CPU) holds an
EmbeddingCollection of ``--tables`` dynamic tables of ``--rows`` keys each,
dim ``--dim``, with Adam state (the rows are filled directly, random keys
and values, at ``--load-factor`` of each table's capacity). Then, each timed
on its own and its files removed after:

* dynamicemb: ``dump`` (checksums, fsync, atomic publish) into a folder and
  ``load`` into a fresh model of the same shape (reading, verifying,
  routing, inserting);
* torch.save / torch.load of the same tensors (keys, embeddings, optimizer
  state, scores per table, on the device), with and without an fsync;
* raw: the same tensors' bytes with ``file.write`` (+ fsync) and
  ``file.readinto`` back to the device.

Prints a markdown table (GB/s = 10^9 bytes per second of the checkpoint's
bytes) and the ratios of dynamicemb to the plain baselines.

    python tools/bench/checkpoint_bench.py --device cuda --tables 10 --rows 1600000 --dim 128
"""

import argparse
import math
import os
import shutil
import sys
import tempfile
import time

import torch

# examples/dist_launch.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import dist_launch


def build(args, device: torch.device, **options):
    """The EmbeddingCollection of ``args.tables`` tables sharded in a world of
    one (``options``: more ``DynamicEmbTableOptions`` fields)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.planner import Topology
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
    from dynamicemb.shard import DynamicEmbeddingCollectionSharder, plan_and_shard

    capacity = math.ceil(args.rows / args.load_factor)
    configs = [
        EmbeddingConfig(
            name=f"t{i}",
            num_embeddings=capacity,
            embedding_dim=args.dim,
            feature_names=[f"f{i}"],
        )
        for i in range(args.tables)
    ]
    model = dist_launch.EcModel(EmbeddingCollection(tables=configs, device=torch.device("meta")))
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=128, **options),
        )
        for c in configs
    }
    params = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.01}
    sharder = DynamicEmbeddingCollectionSharder(fused_params=params)
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs,
        topology=Topology(world_size=1, compute_device=device.type, local_world_size=1),
        constraints=constraints,
        batch_size=512,
        debug=False,
    )
    return plan_and_shard(model, planner, [sharder], device)[0]


def fill(model, args, device: torch.device) -> int:
    """Random keys with random rows and states in every table; returns the
    keys stored."""
    from dynamicemb.shard import dynamic_embedding_kernels

    g = torch.Generator(device=device).manual_seed(0)
    stored = 0
    for kernel in dynamic_embedding_kernels(model):
        emb = kernel.emb_module
        for t in range(len(kernel.table_names)):
            keys = torch.randint(0, 2**62, (args.rows,), generator=g, device=device).unique()
            emb.reserve_rows(t, keys.numel())
            sd = emb.state_dim(t)
            now = int(emb.table.timer().item())
            for lo in range(0, keys.numel(), 1 << 20):
                k = keys[lo : lo + (1 << 20)]
                n = k.numel()
                ok = emb.import_rows(
                    t,
                    k,
                    torch.full((n, 1), now, dtype=torch.int64, device=device),
                    torch.randn(n, args.dim, generator=g, device=device),
                    torch.rand(n, sd, generator=g, device=device),
                )
                stored += int(ok.sum())
    return stored


def plain_tensors(model) -> list[dict[str, torch.Tensor]]:
    """The checkpoint's content as plain tensors on the device, per table."""
    from dynamicemb.shard import dynamic_embedding_kernels

    out = []
    for kernel in dynamic_embedding_kernels(model):
        emb = kernel.emb_module
        for t in range(len(kernel.table_names)):
            parts = list(emb.rows.export_rows(t, 1 << 22))
            out.append(
                {
                    "keys": torch.cat([p.keys for p in parts]),
                    "values": torch.cat([p.embeddings for p in parts]),
                    "opt_values": torch.cat([p.optimizer_state for p in parts]),
                    "scores": torch.cat([p.scores for p in parts]),
                }
            )
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def torch_save(tables, folder, fsync: bool) -> None:
    from dynamicemb.io.files import fsync_path

    for i, t in enumerate(tables):
        name = os.path.join(folder, f"t{i}.pt")
        torch.save(t, name)
        if fsync:
            fsync_path(name)


def torch_load(tables, folder, device) -> list:
    return [
        torch.load(os.path.join(folder, f"t{i}.pt"), map_location=device, weights_only=True)
        for i in range(len(tables))
    ]


def raw_write(tables, folder, fsync: bool) -> None:
    for i, t in enumerate(tables):
        for kind, tensor in t.items():
            name = os.path.join(folder, f"t{i}_{kind}")
            with open(name, "wb") as f:
                f.write(tensor.contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())


def raw_read(tables, folder, device) -> list:
    out = []
    for i, t in enumerate(tables):
        got = {}
        for kind, tensor in t.items():
            host = torch.empty(tensor.shape, dtype=tensor.dtype)
            with open(os.path.join(folder, f"t{i}_{kind}"), "rb") as f:
                f.readinto(host.reshape(-1).view(torch.uint8).numpy())
            got[kind] = host.to(device)
        out.append(got)
    return out


def load_into_fresh(args, device: torch.device, ckpt: str, stored: int) -> float:
    """Seconds of a load into a new model of the same shape (checked full)."""
    from dynamicemb.checkpoint import load
    from dynamicemb.shard import dynamic_embedding_kernels

    fresh = build(args, device)
    seconds = timed(lambda: load(ckpt, fresh, optim=True, show_progress=args.progress), device)
    loaded = sum(sum(k.emb_module.rows.sizes()) for k in dynamic_embedding_kernels(fresh))
    assert loaded == stored, (loaded, stored)
    return seconds


def run(args) -> None:
    from dynamicemb.checkpoint import dump

    device = torch.device(args.device)
    root = tempfile.mkdtemp(prefix="checkpoint_bench_", dir=args.dir)
    start = time.perf_counter()

    def phase(what: str) -> None:
        # Each result is printed when it is measured: a run cut short by a
        # time limit still reports what it measured.
        print(f"[{time.perf_counter() - start:7.1f} s] {what}", flush=True)

    try:
        model = build(args, device)
        stored = fill(model, args, device)
        phase(f"filled {args.tables} tables with {stored} keys")
        ckpt = os.path.join(root, "ckpt")
        report = dump(ckpt, model, optim=True, show_progress=args.progress)
        nbytes = report.nbytes
        phase(f"dump: {nbytes / 1e9:.2f} GB in {report.seconds:.2f} s")
        t_load = load_into_fresh(args, device, ckpt, stored)
        shutil.rmtree(ckpt)
        phase(f"load: {t_load:.2f} s")
        rows = [("dynamicemb dump / load (checksums, fsync)", report.seconds, t_load)]
        print(
            f"{args.tables} tables x {stored // args.tables} keys x dim {args.dim}, Adam state; "
            f"{nbytes / 1e9:.2f} GB in dynamicemb's files; {machine(device)}"
        )
        print("| method | write s | write GB/s | read s | read GB/s |")
        print("|---|---|---|---|---|")
        _row(rows[0], nbytes)

        tables = plain_tensors(model)
        plain = sum(v.numel() * v.element_size() for t in tables for v in t.values())
        phase(f"{plain / 1e9:.2f} GB of plain tensors")
        methods = [
            (f"torch.save / torch.load{' (fsync)' if fsync else ''}", torch_save, torch_load, fsync)
            for fsync in (False, True)
        ] + [
            (f"raw write / readinto{' (fsync)' if fsync else ''}", raw_write, raw_read, fsync)
            for fsync in (False, True)
        ]
        for label, write, read, fsync in methods:
            folder = tempfile.mkdtemp(dir=root)
            t_w = timed(lambda: write(tables, folder, fsync), device)
            t_r = timed(lambda: read(tables, folder, device), device)
            shutil.rmtree(folder)
            rows.append((label, t_w, t_r))
            _row(rows[-1], nbytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    ours_w, ours_r = rows[0][1], rows[0][2]
    for label, w, r in rows[1:]:
        print(f"dynamicemb vs {label}: write {w / ours_w:.2f}x, read {r / ours_r:.2f}x")


def _row(row, nbytes: int) -> None:
    label, w, r = row
    gbps_w, gbps_r = nbytes / w / 1e9, nbytes / r / 1e9
    print(f"| {label} | {w:.2f} | {gbps_w:.2f} | {r:.2f} | {gbps_r:.2f} |", flush=True)


def table_parser(doc: str, rows: int, rows_help: str) -> argparse.ArgumentParser:
    """The options of a benchmark of tables in a world of one: --device,
    --rows (default ``rows``), --dim, --load-factor, --dir and --threads;
    the caller adds its own and passes the parser to ``run_parsed``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if _has_gpu() else "cpu")
    ap.add_argument("--rows", type=int, default=rows, help=rows_help)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--load-factor", type=float, default=0.8)
    ap.add_argument("--dir", default=None, help="where the files go (default: the temp dir)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    return ap


def run_parsed(ap: argparse.ArgumentParser, argv, fn) -> int:
    """Parses ``argv`` with ``table_parser``'s ``ap`` and runs ``fn(args)`` as
    the one rank of a world of one."""
    args = ap.parse_args(argv)
    if args.device == "cuda" and not _has_gpu():
        ap.error("--device cuda: no GPU is visible")
    dist_launch.run_alone(fn, args)
    return 0


def machine(device: torch.device) -> str:
    """What a result line names the run's machine by: the GPU (or CPU) and torch."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return f"{name}, torch {torch.__version__}"


def _has_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def main(argv=None) -> int:
    ap = table_parser(__doc__, rows=1_600_000, rows_help="keys per table")
    ap.add_argument("--tables", type=int, default=10)
    ap.add_argument("--progress", action="store_true", help="show the progress bars")
    return run_parsed(ap, argv, run)


if __name__ == "__main__":
    sys.exit(main())
