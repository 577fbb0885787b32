"""Inference lookups: ``InferenceEmbeddingTable`` in every row format against
TorchRec's quantized EmbeddingBagCollection (INT8) and FBGEMM's INT8
inference TBE, on the same rows and the same bags, in one run; the memory
each format takes; and the two candidate key -> row indexes.

``--tables`` tables of ``--rows`` random int64 keys each, dim ``--dim``,
rows drawn from N(0, 0.05) in float32, given to the inference table as one
delta (``apply_delta``) and to TorchRec and FBGEMM as the inference table's
own INT8 codes (their float16 scale and bias rounded from its float32 ones),
the rows of a table in ascending key order. A batch: ``--batch`` bags per
table of ``--pooling`` ids each, keys drawn log-uniformly (a power law of
exponent 1) over each table's keys (``--miss`` of them keys no table holds,
which read a default row); the inference table gets the raw keys, TorchRec
and FBGEMM their dense row indices (which they need; the mapping is not
timed for them). SUM pooling with per-sample weights, float32 output.

Prints three markdown tables:

* lookups: ids per second of each (the median of ``--repeats`` timed
  batches after ``--warmup``, every lookup timed in turns), against
  TorchRec's INT8, and the INT8 table's key -> row search alone;
* memory: per format, the bytes a key takes (its row and its index entry;
  without the spare room deltas write into) and the keys a GiB holds, as
  the table counts them and as it allocated them; then per format and dim
  for a table alone in its group;
* index: keys per second of the sorted-key index (what the table uses)
  and of the scored hash table's find (``table_find``, the training
  tables' index) for the batch's keys, and the bytes a key takes in each.

    python tools/bench/inference_bench.py --device cpu --rows 1000000 --dim 64 --tables 4
    python tools/bench/inference_bench.py --device cuda --rows 5000000 --dim 128 --tables 4 \
        --batch 8192 --compile
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

FORMATS = ["float32", "float16", "bfloat16", "float8_e4m3fn", "int8"]
GIB = 2**30


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fns: dict, device, warmup: int, repeats: int) -> dict:
    """Median seconds of one call of each of ``fns`` (name -> callable),
    timed in turns, so that a machine's load weighs on all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def make_rows(args, g):
    """Per table: its keys (ascending) and float32 rows."""
    out = []
    for _ in range(args.tables):
        keys = torch.unique(torch.randint(-(2**62), 2**62, (args.rows,), generator=g))
        rows = torch.randn(keys.numel(), args.dim, generator=g) * 0.05
        out.append((keys, rows))
    return out


def make_batch(args, tables, g):
    """(ids, dense, offsets, weights): raw keys and dense row indices."""
    ids, dense = [], []
    for keys, _ in tables:
        n = args.batch * args.pooling
        rank = torch.pow(float(keys.numel()), torch.rand(n, generator=g, dtype=torch.float64))
        idx = (rank.long() - 1).clamp(0, keys.numel() - 1)
        perm = torch.randperm(keys.numel(), generator=g)[: min(keys.numel(), 1 << 20)]
        idx = perm[idx % perm.numel()]
        k = keys[idx]
        miss = torch.rand(n, generator=g) < args.miss
        k = torch.where(miss, torch.randint(2**62, 2**63 - 1, (n,), generator=g), k)
        ids.append(k)
        dense.append(idx)
    offsets = torch.arange(0, args.tables * args.batch * args.pooling + 1, args.pooling)
    weights = torch.rand(offsets[-1].item(), generator=g)
    return torch.cat(ids), torch.cat(dense), offsets, weights


def build_inference(args, tables, fmt, device):
    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
    from dynamicemb.replication import DeltaDumpResult

    names = [f"t{i}" for i in range(args.tables)]
    table = InferenceEmbeddingTable(
        [InferenceTableConfig(n, args.dim) for n in names], dtype=fmt, device=device, spare=0.0
    )
    delta = DeltaDumpResult()
    options = DynamicEmbTableOptions(dim=args.dim)
    for n, (keys, rows) in zip(names, tables):
        delta.append(
            {
                "table_names": n,
                "keys": keys,
                "values": rows,
                "optimizer_states": None,
                "scores": torch.zeros(keys.numel(), 1, dtype=torch.int64),
                "erased_keys": None,
                "evicted_keys": torch.empty(0, dtype=torch.int64),
                "meta": {"num_scores": 1, "table_options": options},
            }
        )
    table.apply_delta({"bench": delta})
    return table, names


def int8_weights(table, names, dim):
    """Per table, the inference table's INT8 codes and their scale and bias
    in float16, FBGEMM's layout (``(codes, scale_bias)``)."""
    out = []
    for n in names:
        _, stored = table.stored_rows(n)
        qp = stored[:, dim:].contiguous().view(torch.float32).half()
        out.append((stored[:, :dim].contiguous(), qp.contiguous().view(torch.uint8)))
    return out


def torchrec_int8(args, names, weights, device):
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    configs = [
        EmbeddingBagConfig(
            name=n,
            num_embeddings=w[0].shape[0],
            embedding_dim=args.dim,
            feature_names=[n],
            data_type=DataType.INT8,
        )
        for n, w in zip(names, weights)
    ]
    return QuantEBC(
        configs,
        is_weighted=True,
        device=device,
        table_name_to_quantized_weights={
            n: (w[0].to(device), w[1].to(device)) for n, w in zip(names, weights)
        },
    )


def fbgemm_int8(args, names, weights, device):
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    location = EmbeddingLocation.HOST if device.type == "cpu" else EmbeddingLocation.DEVICE
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(n, w[0].shape[0], args.dim, SparseType.INT8, location) for n, w in zip(names, weights)],
        device=device,
        output_dtype=SparseType.FP32,
        indices_dtype=torch.int64,
    )
    tbe.fill_random_weights()
    tbe.assign_embedding_weights([(w[0].to(device), w[1].to(device)) for w in weights])
    return tbe


def lookups(args, device, tables, batch):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ids, dense, offsets, weights = (t.to(device) for t in batch)
    n = ids.numel()
    fns, keep = {}, []
    for fmt in FORMATS:
        table, names = build_inference(args, tables, fmt, device)
        keep.append(table)
        fns[f"InferenceEmbeddingTable {fmt}"] = lambda t=table: t(ids, offsets, weights)
        if args.compile:
            compiled = torch.compile(table, fullgraph=True, dynamic=False)
            want = table(ids, offsets, weights)
            torch.testing.assert_close(compiled(ids, offsets, weights), want, rtol=1e-4, atol=1e-4)
            fns[f"InferenceEmbeddingTable {fmt}, torch.compile"] = lambda c=compiled: c(
                ids, offsets, weights
            )
    int8_table = keep[FORMATS.index("int8")]
    index = int8_table._state.groups[0].index
    local = torch.arange(args.tables, device=device, dtype=torch.int32).repeat_interleave(
        n // args.tables
    )
    local = local if args.tables > 1 else None
    fns["its key -> row search alone"] = lambda: index.locate(ids, local)
    weights8 = int8_weights(int8_table, names, args.dim)
    kjt = KeyedJaggedTensor(keys=names, values=dense, offsets=offsets, weights=weights)
    try:
        qebc = torchrec_int8(args, names, weights8, device)
        qebc(kjt)
        fns["TorchRec QuantEmbeddingBagCollection int8"] = lambda: qebc(kjt)
    except Exception as e:
        print(f"TorchRec's quantized EBC is not available here: {e!r}", file=sys.stderr)
    try:
        tbe = fbgemm_int8(args, names, weights8, device)
        tbe(dense, offsets, weights)
        fns["FBGEMM IntNBitTableBatchedEmbeddingBagsCodegen int8"] = lambda: tbe(
            dense, offsets, weights
        )
    except Exception as e:
        print(f"FBGEMM's INT8 inference TBE is not available here: {e!r}", file=sys.stderr)
    results = timed(fns, device, args.warmup, args.repeats)
    misses = int((~torch.isin(ids, torch.cat([k for k, _ in tables]).to(device))).sum())
    print(f"{n:,} ids a batch ({misses:,} held by no table), {offsets.numel() - 1:,} bags\n")
    base = results.get("TorchRec QuantEmbeddingBagCollection int8")
    print("| lookup | ids/s | time per batch (ms) | vs TorchRec int8 |")
    print("|---|---|---|---|")
    for name, seconds in results.items():
        ratio = f"{base / seconds:.2f}x" if base else "-"
        print(f"| {name} | {n / seconds:,.0f} | {seconds * 1e3:.2f} | {ratio} |")


def memory(args, device, tables):
    from dynamicemb.inference import InferenceEmbeddingTable

    held = sum(k.numel() for k, _ in tables)
    print(
        "\n| format | row bytes | index bytes | bytes a key | keys per GiB | measured bytes a key |"
    )
    print("|---|---|---|---|---|---|")
    for fmt in FORMATS:
        table, _ = build_inference(args, tables, fmt, device)
        per_key = InferenceEmbeddingTable.bytes_per_row(fmt, args.dim, args.tables)
        row = table.format.row_bytes(args.dim)
        print(
            f"| {fmt} | {row} | {per_key - row} | {per_key} | {GIB // per_key:,} | "
            f"{table.memory() / held:.1f} |"
        )
        del table


def memory_by_dim() -> None:
    """Bytes a key takes and keys per GiB, per format and dim (a table alone
    in its group; ``InferenceEmbeddingTable.bytes_per_row``)."""
    from dynamicemb.inference import InferenceEmbeddingTable

    dims = (16, 32, 64, 128, 256)
    print("\n| format | " + " | ".join(f"dim {d}: bytes a key, keys per GiB" for d in dims) + " |")
    print("|---|" + "---|" * len(dims))
    for fmt in FORMATS:
        cells = []
        for d in dims:
            b = InferenceEmbeddingTable.bytes_per_row(fmt, d)
            cells.append(f"{b}, {GIB // b / 1e6:.2f}M")
        print(f"| {fmt} | " + " | ".join(cells) + " |")


def index(args, device, tables, batch):
    from dynamicemb.inference.index import Index
    from dynamicemb.table import ScoredHashTable, no_eviction_key_slots, ops

    keys = torch.cat([k for k, _ in tables]).to(device)
    table_ids = torch.cat(
        [torch.full((k.numel(),), t, dtype=torch.int64) for t, (k, _) in enumerate(tables)]
    ).to(device)
    sorted_index = Index.build(
        keys, table_ids, torch.arange(keys.numel(), device=device), args.tables
    )
    ids = batch[0].to(device)
    per = ids.numel() // args.tables
    query_tables = torch.arange(args.tables, device=device).repeat_interleave(per)
    # As a NO_EVICTION table sizes its key map: half full, in whole buckets.
    capacity = -(-no_eviction_key_slots(max(k.numel() for k, _ in tables)) // 128) * 128
    hash_table = ScoredHashTable(
        [capacity] * args.tables, bucket_capacities=128, no_eviction=True, device=device
    )
    for t, (k, _) in enumerate(tables):
        for lo in range(0, k.numel(), 1 << 20):
            part = k[lo : lo + (1 << 20)].to(device)
            hash_table.insert(part, torch.full_like(part, t))
    find_args = hash_table._find_args(ids, query_tables, None, None)
    local = query_tables.to(torch.int32)
    seconds = timed(
        {
            "sorted": lambda: sorted_index.locate(ids, local),
            "hash": lambda: ops().table_find(*find_args, False),
        },
        device,
        args.warmup,
        args.repeats,
    )
    sorted_s, hash_s = seconds["sorted"], seconds["hash"]
    hash_bytes = sum(
        t.numel() * t.element_size()
        for t in (hash_table.keys, hash_table.digests, hash_table.scores)
    )
    print("\n| key -> row index | keys/s | bytes a key |")
    print("|---|---|---|")
    print(
        "| sorted keys, searched in key order (the inference table's) | "
        f"{ids.numel() / sorted_s:,.0f} | "
        f"{sorted_index.nbytes / keys.numel():.1f} |"
    )
    print(
        f"| scored hash table, table_find (NO_EVICTION: half full) | "
        f"{ids.numel() / hash_s:,.0f} | {hash_bytes / keys.numel():.1f} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rows", type=int, default=1_000_000, help="keys per table")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2048, help="bags per table")
    ap.add_argument("--pooling", type=int, default=20, help="ids per bag")
    ap.add_argument("--miss", type=float, default=0.05, help="fraction of ids no table holds")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd tables")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    g = torch.Generator().manual_seed(args.seed)
    tables = make_rows(args, g)
    batch = make_batch(args, tables, g)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{name}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{args.tables} tables x {args.rows:,} keys x dim {args.dim}, {args.batch} bags of "
        f"{args.pooling} ids per table\n"
    )
    lookups(args, device, tables, batch)
    memory(args, device, tables)
    memory_by_dim()
    index(args, device, tables, batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
