"""What the multi-process scripts (examples/train_dlrm.py and serve_replica.py,
the benchmarks tools/bench/sharded_ec_bench.py and checkpoint_bench.py) share:
the --device and --world-size arguments, free ports, one process per rank
(NCCL on GPU ``rank``, or gloo on the CPU), the model of one embedding
collection, and a model planned and sharded over them.
"""

import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class EcModel(torch.nn.Module):
    """A model of one embedding collection, ``ec``: what the planner shards
    and the checkpoint API finds the dynamic tables in."""

    def __init__(self, ec) -> None:
        super().__init__()
        self.ec = ec

    def forward(self, kjt):
        return self.ec(kjt)


def add_device_args(ap: argparse.ArgumentParser, has_gpu: bool) -> None:
    """Adds --device (cuda when a GPU is visible) and --world-size."""
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if has_gpu else "cpu")
    ap.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="processes: default every visible GPU on cuda, 2 on cpu",
    )


def check_device_args(ap: argparse.ArgumentParser, args: argparse.Namespace, has_gpu: bool) -> None:
    """Fills the default world size and checks it against the visible GPUs."""
    if args.device == "cuda" and not has_gpu:
        ap.error("--device cuda: no GPU is visible")
    if args.world_size is None:
        args.world_size = torch.cuda.device_count() if args.device == "cuda" else 2
    if args.device == "cuda" and args.world_size > torch.cuda.device_count():
        ap.error(
            f"--world-size {args.world_size}: only {torch.cuda.device_count()} GPUs are visible"
        )


def free_port() -> int:
    return free_ports(1)


def free_ports(n: int, attempts: int = 100) -> int:
    """The first of ``n`` consecutive TCP ports free on 127.0.0.1 (free when
    asked: another process may take one before the caller binds it)."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65536:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports found in {attempts} attempts")


def init_process_group(
    rank: int, world_size: int, port: int, device: str, threads: int, timeout_s: float = 300
) -> None:
    """Joins the process group of a rank: NCCL on GPU ``rank`` for device
    cuda, else gloo with ``threads`` torch threads; collectives give up after
    ``timeout_s`` seconds."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=torch.device("cuda", rank),
        )
    else:
        torch.set_num_threads(threads)
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
        )


def plan_and_shard(model: torch.nn.Module, planner, sharder, device: torch.device, pg=None):
    """Plans ``model`` with ``planner`` over every rank of ``pg`` (default: the
    world) and shards it with ``DistributedModelParallel`` and ``sharder``.

    Returns:
        (the sharded model, the plan).
    """
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    pg = pg or dist.group.WORLD
    plan = planner.collective_plan(model, [sharder], pg)
    sharded = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=[sharder],
    )
    return sharded, plan


def spawn(fn, args, *more) -> None:
    """Runs ``fn(rank, args.world_size, port, args, *more)`` in one process per
    rank and waits for them all."""
    mp.spawn(
        fn, args=(args.world_size, free_port(), args, *more), nprocs=args.world_size, join=True
    )


def run_alone(fn, args) -> None:
    """Runs ``fn(args)`` as the one rank of a world of one: NCCL on GPU 0 for
    ``args.device`` cuda, else gloo with ``args.threads`` torch threads."""
    init_process_group(0, 1, free_port(), args.device, args.threads)
    try:
        fn(args)
    finally:
        dist.destroy_process_group()


def quiet() -> None:
    """Silences notices that would bury a script's own output: TorchRec's KJT
    validator (raw ids are outside [0, num_embeddings) by design), the
    planner's notes about how a CPU topology was built and dry-run
    estimates, and deprecation notes of the libraries."""
    import logging
    import warnings

    logging.getLogger("torchrec.sparse.jagged_tensor_validator").setLevel(logging.ERROR)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)
    logging.getLogger("torchrec.distributed.planner.storage_reservations").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
