"""What the multi-process scripts (examples/train_dlrm.py and serve_replica.py,
the benchmarks tools/bench/sharded_ec_bench.py and checkpoint_bench.py) share:
the --device and --world-size arguments, free ports, the ranks' process group
(NCCL on the rank's local GPU, or gloo on the CPU) and the model of one embedding
collection. A model is planned and sharded over the ranks by
``dynamicemb.shard.plan_and_shard``.

A rank learns its place from the environment ``torch.distributed.run``
(torchrun) sets: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
and MASTER_PORT. Started without a launcher, a script runs its ranks itself
(``spawn_ranks``): one process per rank on this host, given the same variables, so
the ranks run the same code either way; ``run_job`` does either, and collects
rank 0's result.
"""

import argparse
import contextlib
import datetime
import gc
import json
import os
import socket
import sys
from dataclasses import dataclass

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


@dataclass(frozen=True)
class RankEnv:
    """Where this process stands in the job: its rank among all, its rank on
    this host, and the two counts."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def launched() -> bool:
    """True when a launcher (torchrun, or ``spawn`` here) started this process
    as one rank: RANK and WORLD_SIZE are set."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank_env() -> RankEnv:
    """This rank's place, from the launcher's environment (LOCAL_RANK and
    LOCAL_WORLD_SIZE default to a single host's)."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except (KeyError, ValueError) as e:
        raise RuntimeError(
            f"not started as a rank of a job (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): {e}"
        ) from None
    if not (0 <= rank < world and 0 <= local_rank < local_world <= world):
        raise RuntimeError(
            f"inconsistent launcher environment: RANK {rank}, WORLD_SIZE {world}, "
            f"LOCAL_RANK {local_rank}, LOCAL_WORLD_SIZE {local_world}"
        )
    return RankEnv(rank, world, local_rank, local_world)


def add_device_args(ap: argparse.ArgumentParser, has_gpu: bool) -> None:
    """Adds --device (cuda when a GPU is visible) and --world-size."""
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if has_gpu else "cpu")
    ap.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="processes: default every visible GPU on cuda, 2 on cpu; under torchrun its "
        "WORLD_SIZE",
    )


def check_device_args(ap: argparse.ArgumentParser, args: argparse.Namespace, has_gpu: bool) -> None:
    """Fills the default world size (the launcher's, under torchrun) and
    checks it against the visible GPUs."""
    if args.device == "cuda" and not has_gpu:
        ap.error("--device cuda: no GPU is visible")
    if launched():
        env = rank_env()
        if args.world_size is not None and args.world_size != env.world_size:
            ap.error(
                f"--world-size {args.world_size} differs from the launcher's WORLD_SIZE "
                f"{env.world_size} (leave it out under torchrun)"
            )
        args.world_size = env.world_size
        if args.device == "cuda" and env.local_rank >= torch.cuda.device_count():
            ap.error(
                f"LOCAL_RANK {env.local_rank}: only {torch.cuda.device_count()} GPUs are visible "
                "(torchrun --nproc-per-node must not exceed them)"
            )
        return
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


def _set_rank_env(rank: int, world_size: int, port: int) -> None:
    """The launcher's variables for rank ``rank`` of a job on this host."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def init_from_env(
    device: str, threads: int, timeout_s: float = 300
) -> tuple[RankEnv, torch.device]:
    """Joins the job's process group as the launcher's environment says
    (``rank_env``; MASTER_ADDR and MASTER_PORT for the rendezvous): NCCL on
    GPU LOCAL_RANK for device cuda, else gloo with ``threads`` torch threads;
    collectives give up after ``timeout_s`` seconds.

    Returns:
        (this rank's place, its torch device).
    """
    env = rank_env()
    # Before the group exists: torch.distributed.nn (which TorchRec imports)
    # takes the default group as its functions' default arguments when it
    # is imported. Imported after init_process_group, it would keep the group
    # alive past destroy_process_group, its threads (gloo's workers and
    # transport loop, the store's) still running at exit, where a thread
    # still running or releasing a transfer when the interpreter is torn down
    # aborts the process ("terminate called without an active exception").
    import torch.distributed.nn

    timeout = datetime.timedelta(seconds=timeout_s)
    group = {"timeout": timeout, "rank": env.rank, "world_size": env.world_size}
    store = _attempt_store(timeout)
    if store is not None:
        group["store"] = store
    if device == "cuda":
        dev = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev, **group)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", **group)
    return env, dev


def _attempt_store(timeout: datetime.timedelta):
    """Under torchrun's shared rendezvous store (TORCHELASTIC_USE_AGENT_STORE,
    its default with the c10d rendezvous), that store with this attempt's
    keys apart (TORCHELASTIC_RESTART_COUNT): torch reuses one store across
    restarts, and a restarted process group would otherwise read the
    addresses its dead predecessors left there, and hang or fail to
    connect. None otherwise (the MASTER_ADDR / MASTER_PORT rendezvous)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"dynamicemb/attempt_{attempt}/", store)


def init_process_group(
    rank: int, world_size: int, port: int, device: str, threads: int, timeout_s: float = 300
) -> None:
    """Joins the process group of rank ``rank`` of a job on this host, its
    rendezvous at 127.0.0.1:``port`` (``init_from_env``)."""
    _set_rank_env(rank, world_size, port)
    init_from_env(device, threads, timeout_s)


def _launched_rank(rank: int, world_size: int, port: int, environ: dict, fn, more: tuple) -> None:
    # The launching process's environment now (a forkserver's is that of its start).
    os.environ.clear()
    os.environ.update(environ)
    _set_rank_env(rank, world_size, port)
    fn(*more)


# What the ranks of these scripts import (lazily, in the functions that use them),
# imported once by the forkserver of CPU ranks (``spawn_ranks``) so that the ranks
# forked from it do not each import TorchRec and dynamicemb again: a third of a
# small two-rank job's CPU time. A module this environment lacks is skipped.
RANK_MODULES = (
    "torchrec",
    "torchrec.distributed.model_parallel",
    "torchrec.distributed.planner",
    "torchrec.models.dlrm",
    "torch.distributed.checkpoint",
    "dynamicemb.planner",
    "dynamicemb.shard",
    "dynamicemb.checkpoint",
    "dynamicemb.replication",
)


def spawn_ranks(world_size: int, fn, *more, device: str = "cuda") -> None:
    """Runs ``fn(*more)`` in one process per rank on this host, each with the
    environment torchrun would give it (``rank_env``, a free rendezvous port
    on 127.0.0.1), and waits for them all: what a script does without a
    launcher, so its ranks run as under torchrun.

    For ``device`` cuda each rank is a new interpreter (spawn). On the CPU the
    ranks are forked from a forkserver that imported the script and
    ``RANK_MODULES`` once, so they do not each import torch and TorchRec again."""
    start_method = "spawn" if device == "cuda" else "forkserver"
    if start_method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload(["__main__", *RANK_MODULES])
    mp.start_processes(
        _launched_rank,
        args=(world_size, free_port(), dict(os.environ), fn, more),
        nprocs=world_size,
        join=True,
        start_method=start_method,
    )


@contextlib.contextmanager
def output_to(path: str):
    """Inside the block, this process's sys.stdout and sys.stderr and its file
    descriptors 1 and 2 (those of any process it starts too) append to the
    file ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        with (
            open(path, "a", buffering=1) as text,
            contextlib.redirect_stdout(text),
            contextlib.redirect_stderr(text),
        ):
            yield
    finally:
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)


def exit_status(e: SystemExit) -> int:
    """The exit status Python gives a process that ``e`` ends: its code when
    an int, 0 for None, else 1 with the code printed to stderr."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


_forkserver_log = None  # the log of the forkserver run_here started


def run_here(main, argv: list[str], log: str) -> tuple[int, str]:
    """Runs a script's ``main(argv)`` in this process, as its command line
    would (an exit status; SystemExit's too), with its output appended to
    ``log``; returns (exit status, that output). Its CPU ranks fork from
    this process's forkserver, which the first call starts with
    ``RANK_MODULES`` imported and its output (its ranks') to ``log``: every
    later call imports nothing again, and must pass the same ``log``."""
    global _forkserver_log
    from multiprocessing import forkserver

    if _forkserver_log is None:
        mp.get_context("forkserver").set_forkserver_preload(list(RANK_MODULES))
        with output_to(log):
            forkserver.ensure_running()
        _forkserver_log = log
    if log != _forkserver_log:
        raise ValueError(f"run_here: log {log}, but the ranks write to {_forkserver_log}")
    start, saved_argv = os.path.getsize(log), sys.argv
    sys.argv = [main.__globals__["__file__"], *argv]  # the script's name in its messages
    with output_to(log):
        try:
            rc = main(argv)
        except SystemExit as e:  # refused options (argparse: 2), sys.exit(...)
            rc = exit_status(e)
        finally:
            sys.argv = saved_argv
    with open(log, errors="replace") as f:
        f.seek(start)
        return rc, f.read()


def run_job(fn, args, result_path: str | None, refusals: tuple[type[Exception], ...] = ()) -> int:
    """Runs ``fn(env, device, args)`` on every rank of a job (``init_from_env``
    with ``args.device`` and ``args.threads``): this process as the rank the
    launcher's environment names (under torchrun), else ``args.world_size``
    processes on this host (``spawn_ranks``). Rank 0's return value, when not
    None, is written to ``result_path`` as JSON. A rank that raises one of
    ``refusals`` (the job cannot start or go on) ends with exit status 2, rank
    0 printing the error. Returns the exit status (a rank killed by a signal:
    128 + its number)."""
    if launched():
        return _run_rank(fn, args, result_path, refusals)
    try:
        spawn_ranks(
            args.world_size, _spawned_rank, fn, args, result_path, refusals, device=args.device
        )
    except mp.ProcessExitedException as e:
        return e.exit_code if e.exit_code > 0 else 128 - e.exit_code
    return 0


def _run_rank(fn, args, result_path: str | None, refusals: tuple[type[Exception], ...]) -> int:
    env, device = init_from_env(args.device, args.threads)
    try:
        result = fn(env, device, args)
        # Every rank past its last collective before any tears the group
        # down: a rank destroying it while a peer's transfer is in flight
        # can abort that peer at exit.
        dist.barrier()
    except refusals as e:
        if env.rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        tear_down()
    if result is not None and result_path:
        with open(result_path, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _spawned_rank(fn, args, result_path: str | None, refusals) -> None:
    rc = _run_rank(fn, args, result_path, refusals)
    if rc:
        sys.exit(rc)


def run_alone(fn, args) -> None:
    """Runs ``fn(args)`` as the one rank of a world of one: NCCL on GPU 0 for
    ``args.device`` cuda, else gloo with ``args.threads`` torch threads."""
    for attempt in range(3):
        try:
            init_process_group(0, 1, free_port(), args.device, args.threads)
            break
        except dist.DistNetworkError as e:
            # The port found free was taken before the store bound it: another.
            if "EADDRINUSE" not in str(e) or attempt == 2:
                raise
    try:
        fn(args)
    finally:
        tear_down()


def tear_down() -> None:
    """Destroys the process group so that its threads are gone before the
    process exits (``init_from_env`` says why they must be). A model the
    run built holds the group in reference cycles: they are collected
    first, so that nothing keeps the group alive past its destruction."""
    gc.collect()
    dist.destroy_process_group()
