"""Writes a small click-log sample in the main job's on-disk format (the
Criteo-style TSV of click_tsv.py), for `train_dlrm.py --data`:

    python examples/make_sample_data.py --out /tmp/clicks [--rows 20000] [--gzip]
    python examples/train_dlrm.py --data /tmp/clicks/train --eval-data /tmp/clicks/eval

``<out>/train`` gets ``--files`` files of ``--rows`` lines in all, ``<out>/eval``
one file of ``--eval-rows``. The lines come from a hidden model, as the
generated data of the job does: 13 dense counts (10 % missing), 26
categorical ids (5 % missing) drawn from power laws over vocabularies of 100
to a million ids per column, written as 8 hex digits (or decimal), and a
label drawn from a logistic model of a weight per id and of the dense
features, so a model can learn it.
"""

import argparse
import gzip
import os
import sys

import click_tsv  # examples/click_tsv.py, next to this script
import torch
from click_data import GOLDEN, hidden_weight, power_law_ranks, splitmix64, wrap_int64

MISSING_DENSE = 0.10
MISSING_ID = 0.05
SPARSE_SCALE = 1.5
DENSE_SCALE = 0.5
BIAS = -1.0  # about a quarter of the labels are clicks


def vocabularies() -> list[int]:
    """Distinct ids of each categorical column: 10^2 .. 10^6, spread."""
    n = click_tsv.NUM_CATEGORICAL
    return [int(10 ** (2 + 4 * i / (n - 1))) for i in range(n)]


def sample(rows: int, seed: int, alpha: float = 1.05):
    """``rows`` examples: (labels, dense counts (rows, 13) int64 with -1 for
    missing, ids (rows, 26) int64 with -1 for missing)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.exp(torch.randn(rows, click_tsv.NUM_DENSE, generator=g) * 1.5 + 1.0)
    counts = counts.to(torch.int64) - 1
    dense_w = torch.randn(click_tsv.NUM_DENSE, generator=g, dtype=torch.float64)
    dense_w *= DENSE_SCALE / dense_w.norm()
    logit = torch.log1p(counts.clamp(min=0).double()) @ dense_w - dense_w.sum() + BIAS
    counts[torch.rand(counts.shape, generator=g) < MISSING_DENSE] = -1
    ids = torch.empty(rows, click_tsv.NUM_CATEGORICAL, dtype=torch.int64)
    sparse = torch.zeros(rows, dtype=torch.float64)
    for c, vocab in enumerate(vocabularies()):
        ranks = power_law_ranks(g, rows, vocab, alpha)
        # 32-bit ids as Criteo's hashed ones, from the rank and the column.
        col = splitmix64(ranks * GOLDEN + wrap_int64(1000 + c)) & 0xFFFFFFFF
        present = torch.rand(rows, generator=g) >= MISSING_ID
        sparse += torch.where(present, hidden_weight(col, salt=2000 + c), 0.0)
        ids[:, c] = torch.where(present, col, -1)
    logit = logit + SPARSE_SCALE * sparse / click_tsv.NUM_CATEGORICAL**0.5
    labels = torch.bernoulli(torch.sigmoid(logit), generator=g).to(torch.int64)
    return labels, counts, ids


def write(path: str, labels, counts, ids, base: int) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="ascii", newline="\n") as f:
        for label, d, c in zip(labels.tolist(), counts.tolist(), ids.tolist()):
            f.write(
                click_tsv.format_line(
                    label,
                    [None if x < 0 else x for x in d],
                    [None if x < 0 else x for x in c],
                    base,
                )
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--out", required=True, help="folder to write train/ and eval/ into")
    ap.add_argument("--rows", type=int, default=20000, help="training lines (default: 20000)")
    ap.add_argument("--eval-rows", type=int, default=2000, help="held-out lines (default: 2000)")
    ap.add_argument("--files", type=int, default=2, help="training files (default: 2)")
    ap.add_argument("--gzip", action="store_true", help="write .tsv.gz files")
    ap.add_argument("--id-format", choices=sorted(click_tsv.ID_FORMATS), default="hex")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.rows < 1 or args.eval_rows < 1 or not 1 <= args.files <= args.rows:
        ap.error("--rows and --eval-rows must be positive, --files in 1..--rows")
    suffix = ".tsv.gz" if args.gzip else ".tsv"
    base = click_tsv.ID_FORMATS[args.id_format]
    # One hidden model for both: the eval lines are the last of one sample.
    labels, counts, ids = sample(args.rows + args.eval_rows, args.seed)
    bounds = [args.rows * k // args.files for k in range(args.files + 1)]
    for sub in ("train", "eval"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    for k in range(args.files):
        lo, hi = bounds[k], bounds[k + 1]
        name = os.path.join(args.out, "train", f"part-{k:05d}{suffix}")
        write(name, labels[lo:hi], counts[lo:hi], ids[lo:hi], base)
    lo = args.rows
    write(
        os.path.join(args.out, "eval", f"part-00000{suffix}"),
        labels[lo:],
        counts[lo:],
        ids[lo:],
        base,
    )
    print(
        f"wrote {args.rows} training lines in {args.files} file(s) to {args.out}/train and "
        f"{args.eval_rows} held-out lines to {args.out}/eval ({float(labels.float().mean()):.3f} "
        "clicks per line)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
