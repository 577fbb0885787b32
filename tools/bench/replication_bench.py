"""Replication throughput: incremental dumps and their replays against a full
dump of the same table, in one run.

One process (a world of one: NCCL on the GPU, gloo on the CPU) holds one
dynamic table of ``--rows`` random keys, dim ``--dim``, Adam state and
TIMESTAMP scores, its rows in device memory (filled directly, as
tools/bench/checkpoint_bench.py fills its tables), and two replicas of the
same layout. Then, each timed alone:

* full dump: ``DynamicEmbDump`` (optim=True) of the table to files, and an
  incremental dump from the oldest score (every row, in memory), which both
  replicas replay first (by slot, by key: untimed);
* for each ``--touched`` fraction: a training step over that fraction of the
  rows (untimed) updates their timestamps, rows and state; then
  ``incremental_dump`` from the score before the step (in memory), the same
  delta written as files (``write_delta``), and its replay into the replicas
  by slot (``replay_increment``) and by key (``replay_by_key``). The replicas
  are checked to equal the table.

Prints a markdown table: rows, GB of the delta (keys, embeddings, optimizer
state, scores, slots), seconds, rows/s and GB/s (10^9 bytes per second).

    python tools/bench/replication_bench.py --device cuda --rows 10000000 --dim 128
"""

import argparse
import math
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checkpoint_bench

INT64_MIN = -(2**63)


def delta_bytes(deltas) -> int:
    total = 0
    for d in deltas.values():
        for i in range(len(d)):
            e = d.table(i)
            for c in ("keys", "values", "optimizer_states", "scores"):
                if e[c] is not None:
                    total += e[c].numel() * e[c].element_size()
            total += e["meta"]["slot_index"].numel() * 8
    return total


def delta_rows(deltas) -> int:
    return sum(k.numel() for d in deltas.values() for k in d.keys)


def touch(model, keys: torch.Tensor, device: torch.device, batch: int) -> None:
    """A training step over ``keys`` (in batches): new timestamps, rows, state."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    model.train()
    for lo in range(0, keys.numel(), batch):
        k = keys[lo : lo + batch]
        kjt = KeyedJaggedTensor(
            keys=["f0"], values=k, lengths=torch.ones(k.numel(), dtype=torch.int64, device=device)
        )
        out = model(kjt)["f0"].values()
        out.sum().backward()


def stored_keys(model) -> torch.Tensor:
    from dynamicemb.shard import dynamic_embedding_kernels

    (kernel,) = dynamic_embedding_kernels(model)
    return torch.cat([p.keys for p in kernel.emb_module.rows.export_rows(0, 1 << 22)])


def same_rows(a, b) -> bool:
    from dynamicemb.shard import dynamic_embedding_kernels

    (ka,) = dynamic_embedding_kernels(a)
    (kb,) = dynamic_embedding_kernels(b)
    pa = list(ka.emb_module.rows.export_rows(0, 1 << 22))
    pb = list(kb.emb_module.rows.export_rows(0, 1 << 22))
    keys_a, keys_b = torch.cat([p.keys for p in pa]), torch.cat([p.keys for p in pb])
    ea, eb = torch.cat([p.embeddings for p in pa]), torch.cat([p.embeddings for p in pb])
    oa, ob = torch.argsort(keys_a), torch.argsort(keys_b)
    return torch.equal(keys_a[oa], keys_b[ob]) and torch.equal(ea[oa], eb[ob])


def run(args) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.modules.embedding_configs import EmbeddingConfig

    from dynamicemb import EvictedItemMode, get_table_value_bytes
    from dynamicemb.checkpoint import dump
    from dynamicemb.incremental_dump import get_score, incremental_dump, replay_increment
    from dynamicemb.replication import replay_by_key, write_delta

    device = torch.device(args.device)
    timed = checkpoint_bench.timed
    shape = argparse.Namespace(tables=1, rows=args.rows, dim=args.dim, load_factor=args.load_factor)
    # Rows in device memory (the whole table's bytes as its budget); evictions
    # retained: what a replay by key needs (this run evicts nothing).
    config = EmbeddingConfig(
        name="t0", num_embeddings=math.ceil(args.rows / args.load_factor), embedding_dim=args.dim
    )
    options = dict(
        evicted_item_mode=EvictedItemMode.RETAIN_KEY,
        global_hbm_for_values=get_table_value_bytes(config, EmbOptimType.ADAM, 1, 128),
    )
    model, by_slot, by_key = (checkpoint_bench.build(shape, device, **options) for _ in range(3))
    stored = checkpoint_bench.fill(model, shape, device)
    root = tempfile.mkdtemp(prefix="replication_bench_", dir=args.dir)
    rows = []
    try:
        report = dump(os.path.join(root, "full"), model, optim=True, show_progress=False)
        rows.append(("full dump: DynamicEmbDump to files", stored, report.nbytes, report.seconds))
        shutil.rmtree(os.path.join(root, "full"))
        box = {}
        t = timed(lambda: box.update(d=incremental_dump(model, INT64_MIN)), device)
        full = box.pop("d")
        rows.append(("full dump: incremental_dump of every row", stored, delta_bytes(full), t))
        replay_increment(by_slot, full)
        replay_by_key(by_key, full)
        del full
        keys = stored_keys(model)
        g = torch.Generator(device=device).manual_seed(1)
        for fraction in args.touched:
            n = max(1, int(fraction * stored))
            pick = keys[torch.randperm(keys.numel(), generator=g, device=device)[:n]]
            threshold = get_score(model)
            touch(model, pick, device, args.batch)
            t = timed(lambda: box.update(d=incremental_dump(model, threshold)), device)
            delta = box.pop("d")
            got = delta_rows(delta)
            assert got == n, (got, n)
            nbytes = delta_bytes(delta)
            pct = f"{100 * fraction:g} %"
            rows.append((f"{pct} touched: incremental_dump", got, nbytes, t))
            folder = os.path.join(root, f"stream_{fraction}")
            seq = delta[next(iter(delta))].meta[0]["sequence"]
            t = timed(lambda: write_delta(folder, seq, delta), device)
            rows.append((f"{pct} touched: write_delta (files)", got, nbytes, t))
            shutil.rmtree(folder)
            t = timed(lambda: replay_increment(by_slot, delta), device)
            rows.append((f"{pct} touched: replay_increment (by slot)", got, nbytes, t))
            t = timed(lambda: replay_by_key(by_key, delta), device)
            rows.append((f"{pct} touched: replay_by_key", got, nbytes, t))
            delta = None  # frees the host copy before the next one
        assert same_rows(model, by_slot) and same_rows(model, by_key), "replicas differ"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"1 table x {stored} keys x dim {args.dim}, Adam state, TIMESTAMP scores; "
        f"{checkpoint_bench.machine(device)}"
    )
    print("| operation | rows | GB | s | rows/s | GB/s |")
    print("|---|---|---|---|---|---|")
    for label, n, nbytes, s in rows:
        print(
            f"| {label} | {n:,} | {nbytes / 1e9:.3f} | {s:.3f} | {n / s:,.0f} | "
            f"{nbytes / s / 1e9:.2f} |"
        )
    full_s = rows[0][3]
    for label, _, _, s in rows[2:]:
        print(f"{label}: {full_s / s:.1f}x faster than the full DynamicEmbDump")


def main(argv=None) -> int:
    ap = checkpoint_bench.table_parser(__doc__, rows=10_000_000, rows_help="keys in the table")
    ap.add_argument(
        "--touched", type=float, nargs="+", default=[0.01, 0.1], help="fractions per delta"
    )
    ap.add_argument("--batch", type=int, default=1 << 20, help="keys per training batch")
    return checkpoint_bench.run_parsed(ap, argv, run)


if __name__ == "__main__":
    sys.exit(main())
