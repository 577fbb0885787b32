"""A serving replica that follows a training job through a folder of deltas.

Three commands:

  train   a training job (one process per GPU over NCCL, or gloo processes on
          the CPU; run directly, or as the ranks of torchrun on one node or
          several) on a two-table EmbeddingCollection that evicts all along;
          it publishes a checkpoint into the folder now and then and a delta
          after every step or few (DeltaPublisher), and at the end a last
          checkpoint of everything (<folder>/final) to check replicas against.
          With --resume it first loads the folder's checkpoint: a job
          restarted after a crash continues the stream (in a new epoch when
          the dead job had published past that checkpoint; replicas switch
          to it). Without, a folder that holds a stream already is refused.
  serve   a replica (one process, CPU or GPU): an InferenceEmbeddingTable
          (rows stored as --dtype: float32, float16, bfloat16, float8_e4m3fn
          or int8) that loads the folder's checkpoint, then applies deltas as
          they appear (DeltaFollower, in a thread) while it answers lookups:
          lines "<table> <key> <key> ..." on stdin get the rows back, and
          --probe prints a lookup summary every second. It imports none of
          the training code. With --until it stops once it reflects that
          delta; with --compare it then waits for the job's final checkpoint
          and compares every row with it (a table of the same dtype built
          from that checkpoint holds the same bytes).
  demo    train and serve side by side: the job in the background, the
          replica following it, and the comparison at the end.

    python examples/serve_replica.py demo --steps 60
    python examples/serve_replica.py train --folder /tmp/stream --steps 500 &
    python examples/serve_replica.py serve --folder /tmp/stream --probe --dtype int8
    torchrun --standalone --nproc-per-node 2 examples/serve_replica.py train --folder /tmp/stream
"""

import argparse
import os
import sys
import tempfile
import threading
import time

import checkout  # noqa: F401 (examples/checkout.py: this checkout's dynamicemb)
import dist_launch  # examples/dist_launch.py, next to this script
import torch

TABLES = ("user", "item")
DIM = 16
KEY_SPACE = 200_000
ROWS_PER_RANK = 4096  # of the job's tables: far fewer than the ids they see


def build(
    world: int, device: torch.device, rows: int, training: bool, local_world: int | None = None
):
    """The EmbeddingCollection of both tables, sharded over the default group
    (``local_world`` of its ``world`` ranks on each host; default all)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    from dynamicemb import (
        DynamicEmbInitializerArgs,
        DynamicEmbInitializerMode,
        DynamicEmbScoreStrategy,
        DynamicEmbTableOptions,
        EvictedItemMode,
    )
    from dynamicemb.planner import (
        DynamicEmbeddingShardingPlanner,
        DynamicEmbParameterConstraints,
        topology,
    )
    from dynamicemb.shard import DynamicEmbeddingCollectionSharder, plan_and_shard

    configs = [
        EmbeddingConfig(name=t, num_embeddings=rows * world, embedding_dim=DIM, feature_names=[t])
        for t in TABLES
    ]
    constraints = {
        t: DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                bucket_capacity=128,
                score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
                dist_type="hash_roundrobin",
                training=training,
                # Replicas of another layout learn evictions from the deltas.
                evicted_item_mode=EvictedItemMode.RETAIN_KEY,
                initializer_args=DynamicEmbInitializerArgs(
                    mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.05, upper=0.05
                ),
            ),
        )
        for t in TABLES
    }
    collection = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    sharder = DynamicEmbeddingCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    )
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs,
        topology=topology(
            world_size=world, compute_device=device.type, local_world_size=local_world or world
        ),
        constraints=constraints,
        batch_size=256,
        debug=False,
    )
    return plan_and_shard(dist_launch.EcModel(collection), planner, [sharder], device)[0]


def batch(step: int, rank: int, size: int, device: torch.device):
    """Log-uniform ids (a power law of exponent 1) of both tables."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(7919 * step + rank)
    u = torch.rand(len(TABLES) * size, generator=g, dtype=torch.float64)
    keys = torch.pow(float(KEY_SPACE), u).long() - 1
    return KeyedJaggedTensor(
        keys=list(TABLES),
        values=keys,
        lengths=torch.ones(len(TABLES) * size, dtype=torch.int64),
    ).to(device)


# ------------------------------------------------------------------- train --


def _train_steps(env, device, args) -> None:
    """The trainer's work on one rank: publish deltas, then a final dump."""
    from dynamicemb.checkpoint import dump, load
    from dynamicemb.checkpoint.layout import MANIFEST
    from dynamicemb.replication import DeltaPublisher
    from dynamicemb.replication.stream import CHECKPOINT_DIR

    rank, world = env.rank, env.world_size
    model = build(world, device, ROWS_PER_RANK, training=True, local_world=env.local_world_size)
    resumed = os.path.join(args.folder, CHECKPOINT_DIR)
    if args.resume and os.path.isfile(os.path.join(resumed, MANIFEST)):
        load(resumed, model, show_progress=False)
    publisher = DeltaPublisher(model, args.folder)
    if rank == 0 and args.verbose:
        print(f"train: run {publisher.run}, epoch {publisher.epoch}", flush=True)
    publisher.checkpoint()
    for step in range(args.steps):
        out = model(batch(step, rank, args.batch_size, device))
        sum(v.values().sum() for v in out.values()).backward()
        if (step + 1) % args.publish_every == 0:
            seq = publisher.publish()
            if rank == 0 and args.verbose:
                print(f"train: step {step + 1}, delta {seq}", flush=True)
        if (step + 1) % args.checkpoint_every == 0:
            publisher.checkpoint()
        time.sleep(args.step_delay)
    if args.steps % args.publish_every:
        publisher.publish()
    dump(os.path.join(args.folder, "final"), model, show_progress=False)
    if rank == 0:
        print(f"train: done, {args.steps} steps, final checkpoint written", flush=True)


def train(args) -> int:
    """The job's ranks (under torchrun this process is one of them), each
    ending as the main job's do (``dist_launch.run_job``)."""
    return dist_launch.run_job(_train_steps, args, None)


# ------------------------------------------------------------------- serve --


def serving_table(args, path: str | None = None):
    """The replica's InferenceEmbeddingTable: sequence lookups of both
    tables (one feature each), rows stored as ``--dtype``; from the
    checkpoint at ``path`` if given, else empty."""
    from dynamicemb import DynamicEmbPoolingMode
    from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    kw = {"pooling": DynamicEmbPoolingMode.NONE, "dtype": args.dtype, "device": device}
    configs = [InferenceTableConfig(t, DIM, [t]) for t in TABLES]
    if path is not None:
        return InferenceEmbeddingTable.from_checkpoint(path, configs, **kw)
    return InferenceEmbeddingTable(configs, **kw)


def _compare_with_final(table, folder: str, args) -> int:
    """Builds a second table of the same dtype from the job's final
    checkpoint and compares every key and stored row of both."""
    reference = serving_table(args, os.path.join(folder, "final"))
    worst, total = 0.0, 0
    for name in TABLES:
        keys, stored = reference.stored_rows(name)
        held, ours = table.stored_rows(name)
        total += keys.numel()
        extra = held.numel() - keys.numel()
        print(f"serve: table {name}: {keys.numel()} keys, {extra} keys more than the job")
        if extra or not torch.equal(held, keys):
            return 1
        if keys.numel():
            diff = table.rows(name, keys) - reference.rows(name, keys)
            worst = max(worst, float(diff.abs().max()))
            if not torch.equal(ours, stored):
                return 1
    print(f"serve: the replica holds the job's {total} keys, max |difference| {worst}")
    return 0 if worst == 0.0 else 1


def serve(args) -> int:
    from dynamicemb.replication import DeltaFollower
    from dynamicemb.replication.stream_files import list_deltas

    torch.set_num_threads(args.threads)
    table = serving_table(args)
    follower = DeltaFollower(table, args.folder)
    deadline = time.monotonic() + args.timeout
    while not follower.load_checkpoint():
        if time.monotonic() > deadline:
            print(f"serve: no checkpoint in {args.folder}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    run, epoch, seq = follower.position
    print(
        f"serve: loaded the checkpoint (delta {seq}) of run {run}, epoch {epoch} into a "
        f"{table.format.name} table of {table.memory()} bytes",
        flush=True,
    )
    done = threading.Event()

    def follow():
        # Lookups run meanwhile: each reads the rows before or after a delta.
        while not done.is_set():
            applied = follower.poll()
            if applied:
                held = {n: s.upserted for c in follower.stats.values() for n, s in c.items()}
                print(f"serve: applied deltas {applied} (last: {held} rows)", flush=True)
            if args.until and (follower.sequence or 0) >= args.until:
                done.set()
            time.sleep(args.poll)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    probe_keys = torch.arange(0, 64)
    while not done.is_set():
        if time.monotonic() > deadline:
            print("serve: timed out", file=sys.stderr)
            done.set()
            return 1
        if args.probe:
            rows = table.rows(TABLES[0], probe_keys).cpu()
            found = int((rows.abs().sum(1) > 0).sum())
            print(
                f"serve: delta {follower.sequence}, {found} of {len(probe_keys)} probe keys "
                f"held, row norm {float(rows.norm()):.4f}",
                flush=True,
            )
            time.sleep(1.0)
        elif args.until:
            time.sleep(0.2)
        else:
            line = sys.stdin.readline()
            if not line:
                break
            parts = line.split()
            if not parts or parts[0] not in TABLES:
                print(f"serve: expected '<table> <key> ...' with a table of {TABLES}")
                continue
            keys = torch.tensor([int(k) for k in parts[1:]], dtype=torch.int64)
            rows = table.rows(parts[0], keys).cpu()
            for k, row in zip(keys.tolist(), rows):
                print(k, " ".join(f"{v:.5f}" for v in row.tolist()), flush=True)
    done.set()
    thread.join()
    print(
        f"serve: stopped at delta {follower.sequence}; deltas in the folder: "
        f"{list_deltas(args.folder)[-3:]}",
        flush=True,
    )
    if args.compare:
        from dynamicemb.checkpoint.layout import MANIFEST

        final = os.path.join(args.folder, "final", MANIFEST)
        while not os.path.isfile(final):
            if time.monotonic() > deadline:
                print("serve: the job's final checkpoint did not appear", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return _compare_with_final(table, args.folder, args)
    return 0


def demo(args) -> int:
    import subprocess

    folder = args.folder or tempfile.mkdtemp(prefix="dynamicemb-stream-")
    common = ["--folder", folder, "--device", args.device]
    last = -(-args.steps // args.publish_every)
    job = subprocess.Popen(
        [sys.executable, __file__, "train", *common, "--steps", str(args.steps)]
        + ["--world-size", str(args.world_size), "--publish-every", str(args.publish_every)]
        + ["--checkpoint-every", str(args.checkpoint_every), "--step-delay", "0.05"]
    )
    rc = serve(
        argparse.Namespace(
            **{
                **vars(args),
                "folder": folder,
                "until": last,
                "probe": False,
                "poll": 0.1,
                "compare": True,
            }
        )
    )
    return rc or job.wait()


def main(argv=None) -> int:
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    cmds = {}
    for name in ("train", "serve", "demo"):
        p = sub.add_parser(name)
        cmds[name] = p
        p.add_argument("--folder", required=name != "demo", help="the stream folder")
        p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if has_gpu else "cpu")
        p.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
        p.add_argument("--timeout", type=float, default=600.0, help="seconds a replica waits")
    for name in ("train", "demo"):
        p = cmds[name]
        p.add_argument("--steps", type=int, default=200)
        p.add_argument("--world-size", type=int, default=None)
        p.add_argument("--batch-size", type=int, default=512)
        p.add_argument("--publish-every", type=int, default=1, help="steps between deltas")
        p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    cmds["train"].add_argument("--step-delay", type=float, default=0.0, help="seconds per step")
    cmds["train"].add_argument("--verbose", action="store_true")
    cmds["train"].add_argument(
        "--resume", action="store_true", help="continue the folder's stream from its checkpoint"
    )
    for name in ("serve", "demo"):
        cmds[name].add_argument(
            "--dtype",
            choices=["float32", "float16", "bfloat16", "float8_e4m3fn", "int8"],
            default="float32",
            help="how the replica stores rows",
        )
    for name in ("serve",):
        p = cmds[name]
        p.add_argument("--probe", action="store_true", help="print a lookup every second")
        p.add_argument("--until", type=int, default=0, help="stop after this delta")
        p.add_argument(
            "--compare",
            action="store_true",
            help="then wait for the job's final checkpoint and compare every row with it",
        )
        p.add_argument("--poll", type=float, default=0.2, help="seconds between folder polls")
    args = ap.parse_args(argv)
    if args.command in ("train", "demo"):
        if args.command == "demo" and dist_launch.launched():
            ap.error("demo starts its own job and replica: run it directly, not under torchrun")
        dist_launch.check_device_args(cmds[args.command], args, has_gpu)
    return {"train": train, "serve": serve, "demo": demo}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
