"""The main job's options (examples/train_dlrm.py): the argument parser,
every check of the values before a process group is made (each refusal an
argparse usage error naming the option), and --crash-at, the kill points a
recovery test asks for.
"""

import argparse
import os
import signal
from collections.abc import Callable

import click_tsv  # examples/click_tsv.py, next to this script
import criteo_preset  # examples/criteo_preset.py
import dist_launch  # examples/dist_launch.py
import torch
import train_checkpoint  # examples/train_checkpoint.py

from dynamicemb import dynamicemb_config
from dynamicemb.io.dtypes import dtype_name

# --embedding-dtype's values: the library's embedding dtypes by name.
EMBEDDING_DTYPES = {dtype_name(d): d for d in dynamicemb_config.EMBEDDING_DTYPES}


def parse(argv: list[str] | None, description: str, describe: Callable) -> argparse.Namespace:
    """The job's options from ``argv`` (None: the command line), checked: a
    bad one ends the program with argparse's usage error (exit status 2),
    naming it. ``describe(args)`` gives the (model, data) descriptions of the
    job the options make (raising FileNotFoundError for missing --data or
    --eval-data files); the newest checkpoint of a --checkpoint-dir must be
    of that model and data (train_checkpoint.check_dir)."""
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    ap = parser(description, has_gpu)
    args = ap.parse_args(argv)
    check(ap, args, has_gpu, describe)
    return args


def parser(description: str, has_gpu: bool) -> argparse.ArgumentParser:
    """The job's options."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=2000, help="training steps (default: 2000)")
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"examples per rank and step (default: {DEFAULTS[None]['batch_size']}; "
        f"{DEFAULTS[criteo_preset.NAME]['batch_size']:,} with --preset criteo)",
    )
    dist_launch.add_device_args(ap, has_gpu)
    ap.add_argument(
        "--dim",
        type=int,
        default=None,
        help=f"embedding dim (default: {DEFAULTS[None]['dim']}; "
        f"{DEFAULTS[criteo_preset.NAME]['dim']} with --preset criteo)",
    )
    ap.add_argument(
        "--preset",
        choices=[criteo_preset.NAME],
        default=None,
        help="criteo: the shape of TorchRec's DLRM examples (criteo_preset.py): 26 features of "
        "Criteo 1TB's cardinalities, one id each, TorchRec's DLRM or DLRM_DCN, dim "
        f"{criteo_preset.DIM}, batch {criteo_preset.BATCH_SIZE:,} per rank, the tables sized "
        "to --emb-budget-gib",
    )
    ap.add_argument(
        "--interaction",
        choices=list(criteo_preset.INTERACTIONS),
        default="dot",
        help="with --preset: DLRM's pairwise dot products (dot, the default) or a DCN-v2 cross "
        "network (dcn)",
    )
    ap.add_argument(
        "--emb-budget-gib",
        type=float,
        default=None,
        help="with --preset: device memory of all dynamic tables' rows, embeddings and "
        f"optimizer state, over all ranks (default {criteo_preset.EMB_BUDGET_GIB:g}); the "
        "largest features' tables are capped to fit",
    )
    ap.add_argument(
        "--emb-optimizer",
        choices=["rowwise_adagrad", "adam", "rowwise_rmsprop_ar"],
        default="rowwise_adagrad",
        help="fused optimizer of the embedding tables (adam: on cuda only; rowwise_rmsprop_ar: "
        "the dynamic tables', the static one keeps rowwise_adagrad)",
    )
    ap.add_argument(
        "--ar-alpha",
        type=float,
        default=0.0,
        help="rowwise_rmsprop_ar: adaptive regularization coefficient (default 0)",
    )
    ap.add_argument(
        "--row-warmup-steps",
        type=int,
        default=0,
        help="rowwise_rmsprop_ar: updates over which a new row's step size ramps up (default 0)",
    )
    ap.add_argument(
        "--score-strategy",
        choices=["step", "timestamp", "lfu", "timestamp_lfu", "decayed_lfu"],
        default="step",
        help="what the dynamic tables evict (default step: the least recently used; "
        "decayed_lfu: (timestamp, lfu) with a score_function, the frequency less one a second)",
    )
    ap.add_argument(
        "--admission-threshold",
        type=int,
        default=0,
        help="admit an id into a dynamic table once seen this often (default 0: every id)",
    )
    ap.add_argument(
        "--refuse-cold-keys",
        action="store_true",
        help="a new id colder than its full bucket's lowest is not inserted (refuse_cold_keys)",
    )
    ap.add_argument(
        "--embedding-dtype",
        choices=list(EMBEDDING_DTYPES),
        default="float32",
        help="the dynamic tables' rows (float32, the default; float16 and bfloat16; "
        "float8_e4m3fn: eight bits and a per-row scale, written with stochastic rounding); "
        "the optimizer state stays float32 (docs/storage.md). A checkpoint of another dtype "
        "is converted on --resume",
    )
    ap.add_argument("--emb-lr", type=float, default=0.05)
    ap.add_argument("--dense-lr", type=float, default=3e-3)
    ap.add_argument(
        "--alpha", type=float, default=1.05, help="power-law exponent of the ids (default: 1.05)"
    )
    ap.add_argument(
        "--eval-batches", type=int, default=8, help="held-out batches per rank (default: 8)"
    )
    ap.add_argument(
        "--log-window", type=int, default=50, help="steps in a moving-average loss (default: 50)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads per CPU process (default: 1)"
    )
    ap.add_argument(
        "--no-count-distinct",
        dest="count_distinct",
        action="store_false",
        help="do not count the distinct ids of the run",
    )
    ap.add_argument("--summary-json", default=None, help="write rank 0's summary here")
    data = ap.add_argument_group("data from files (click_tsv.py: Criteo-style TSV)")
    data.add_argument(
        "--data",
        default=None,
        help="train on the click logs of this file or folder (.tsv, .tsv.gz) instead of "
        "generated data",
    )
    data.add_argument(
        "--eval-data", default=None, help="held-out click logs to evaluate on (with --data)"
    )
    data.add_argument(
        "--id-format",
        choices=sorted(click_tsv.ID_FORMATS),
        default="hex",
        help="the categorical ids of --data: hexadecimal (Criteo's, the default) or decimal",
    )
    data.add_argument(
        "--table-capacity",
        type=int,
        default=1 << 16,
        help="rows of each categorical feature's dynamic table with --data (all ranks; default "
        "65536)",
    )
    ck = ap.add_argument_group("checkpoints (train_checkpoint.py)")
    ck.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save checkpoints here, one step_<N> folder each; a folder or an fsspec URL "
        "(s3://bucket/run: pip install 'dynamicemb[s3]')",
    )
    ck.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="steps between checkpoints (default 0: only after the last step)",
    )
    ck.add_argument(
        "--keep", type=int, default=3, help="complete checkpoints to keep (default 3; 0: all)"
    )
    ck.add_argument(
        "--resume",
        action="store_true",
        help="go on from the newest complete checkpoint in --checkpoint-dir (none yet: start at "
        "step 0), at any world size",
    )
    ck.add_argument(
        "--warm-start",
        default=None,
        metavar="PATH",
        help="fill the dynamic tables before the first step from a TorchRec "
        "EmbeddingBagCollection's state_dict (a torch.save file) or a torch.distributed."
        "checkpoint folder of it: row i becomes key i (not when --resume finds a checkpoint)",
    )
    ck.add_argument(
        "--crash-at",
        type=_crash_at,
        default=None,
        metavar="POINT:STEP[:RANK]",
        help="for testing recovery: rank RANK (default 0) kills itself with SIGKILL at step "
        "STEP: 'step' (after its backward pass), 'dump' (in its checkpoint, the tables "
        "written, nothing published) or 'published' (right after its checkpoint was "
        "published); on torchrun's first attempt only",
    )
    ap.add_argument(
        "--soak-every",
        type=int,
        default=0,
        help="every N steps, check every rank's table counters and record rank 0's host and "
        "device memory in the summary (tools/soak.py); 0: never (default)",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve the tables' metrics for Prometheus: rank r at this port + r, path /metrics",
    )
    ap.add_argument("--metrics-address", default="0.0.0.0", help="address of the metrics endpoints")
    ap.add_argument(
        "--metrics-wait",
        type=float,
        default=0.0,
        help="after training, keep serving until the final figures were scraped (at most this "
        "many seconds; default 0: do not wait)",
    )
    return ap


def check(ap: argparse.ArgumentParser, args: argparse.Namespace, has_gpu: bool, describe) -> None:
    """Refuses (``ap.error``) what ``args`` cannot run, naming the option,
    before anything is started; fills in the default world size."""
    dist_launch.check_device_args(ap, args, has_gpu)
    check_preset(ap, args)
    if args.emb_optimizer == "adam" and args.device == "cpu":
        # The static table's FBGEMM kernel (TorchRec's FUSED) has no Adam on
        # the CPU; the dynamic tables would run it.
        ap.error(
            "--emb-optimizer adam needs --device cuda (FBGEMM's CPU kernel of the static table "
            "supports rowwise Adagrad, not Adam)"
        )
    if args.steps < 1 or args.batch_size < 1 or args.world_size < 1:
        ap.error("--steps, --batch-size and --world-size must be positive")
    if args.metrics_port is not None and not 0 < args.metrics_port <= 65536 - args.world_size:
        ap.error(
            f"--metrics-port {args.metrics_port}: ports {args.metrics_port}.."
            f"{args.metrics_port + args.world_size - 1} (one per rank) must lie in 1..65535"
        )
    if args.metrics_wait < 0:
        ap.error(f"--metrics-wait must not be negative, got {args.metrics_wait}")
    if args.soak_every < 0:
        ap.error("--soak-every must not be negative")
    if args.summary_json is not None:
        folder = os.path.dirname(os.path.abspath(args.summary_json))
        if not os.path.isdir(folder):
            ap.error(f"--summary-json {args.summary_json}: the folder {folder} does not exist")
    if args.eval_data is not None and args.data is None:
        ap.error("--eval-data needs --data (the generated data has its own held-out batches)")
    if args.table_capacity < 1:
        ap.error(f"--table-capacity must be positive, got {args.table_capacity}")
    try:
        model, data = describe(args)
    except FileNotFoundError as e:
        ap.error(f"--data / --eval-data: {e}")
    if args.warm_start is not None:
        from dynamicemb.io import fs

        try:
            there = fs.of(args.warm_start).exists(args.warm_start)
        except (ImportError, ValueError) as e:
            ap.error(f"--warm-start {e}")
        if not there:
            ap.error(f"--warm-start {args.warm_start}: does not exist")
    if args.checkpoint_dir is None:
        for flag, value, default in (
            ("--resume", args.resume, False),
            ("--checkpoint-every", args.checkpoint_every, 0),
            ("--crash-at", args.crash_at, None),
        ):
            if value != default:
                ap.error(f"{flag} needs --checkpoint-dir")
        return
    if args.checkpoint_every < 0 or args.keep < 0:
        ap.error("--checkpoint-every and --keep must not be negative")
    try:
        found = train_checkpoint.check_dir(args.checkpoint_dir, args.resume, model, data)
    except train_checkpoint.JobError as e:
        ap.error(str(e))
    if found is not None and found.step > args.steps:
        ap.error(
            f"--steps {args.steps}: the newest checkpoint in {args.checkpoint_dir} is after "
            f"step {found.step} already"
        )


# The sizes a run takes unless told: without a preset, and with each.
DEFAULTS = {
    None: {"dim": 16, "batch_size": 256},
    criteo_preset.NAME: {"dim": criteo_preset.DIM, "batch_size": criteo_preset.BATCH_SIZE},
}


def check_preset(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fills in the preset's sizes where not given; refuses the preset's
    options without it."""
    for name, value in DEFAULTS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.preset is None:
        for flag, value, default in (
            ("--interaction", args.interaction, "dot"),
            ("--emb-budget-gib", args.emb_budget_gib, None),
        ):
            if value != default:
                ap.error(f"{flag} needs --preset {criteo_preset.NAME}")
        return
    if args.emb_budget_gib is None:
        args.emb_budget_gib = criteo_preset.EMB_BUDGET_GIB
    if not args.emb_budget_gib > 0:
        ap.error(f"--emb-budget-gib must be positive, got {args.emb_budget_gib}")


CRASH_POINTS = ("step", "dump", "published")


def _crash_at(text: str) -> tuple[str, int, int]:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or parts[0] not in CRASH_POINTS:
            raise ValueError
        return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not POINT:STEP[:RANK] with POINT one of {', '.join(CRASH_POINTS)}"
        ) from None


def embedding_dtype(args: argparse.Namespace) -> torch.dtype:
    """The dynamic tables' embedding dtype (--embedding-dtype)."""
    return EMBEDDING_DTYPES[args.embedding_dtype]


def crash_hook(args, rank: int):
    """``crash(point, step)``: kills this process with SIGKILL where
    --crash-at says (on torchrun's first attempt, or without torchrun)."""
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    def crash(point: str, step: int) -> None:
        if args.crash_at == (point, step, rank) and first_attempt:
            print(f"rank {rank}: --crash-at {point}:{step}:{rank}: SIGKILL", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return crash
