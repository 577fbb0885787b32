"""What the main job's tests share: running examples/train_dlrm.py directly
or under torchrun, and reading the checkpoints it writes back from their
files (the dynamic tables' key, value, optimizer and score files by their
meta JSON; the TorchRec part through DCP's own conversion; trainer.pt), so
two runs can be compared row by row and tensor by tensor."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

import dist_launch  # examples/dist_launch.py
import torch
import train_checkpoint  # examples/train_checkpoint.py (pyproject: pytest pythonpath)
import train_dlrm  # examples/train_dlrm.py

from tests.embedding.fp8_reference import fp8_values, pad4

# A small run: few steps, small batches, two windows of ten steps.
SMALL = "--device cpu --batch-size 64 --eval-batches 2 --log-window 10".split()
RUN_TIMEOUT_S = 240


def _run(cmd: list[str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(
        cmd,
        env=train_dlrm.job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout


_LOG = os.path.join(tempfile.mkdtemp(prefix="main-job-"), "jobs.log")
atexit.register(shutil.rmtree, os.path.dirname(_LOG), True)


def run_job(argv: list[str]) -> tuple[int, str]:
    """Runs the job directly (its own launcher), its ``main`` in this process
    (dist_launch.run_here: the ranks forked from one forkserver, which
    imports torch, TorchRec and dynamicemb once for the test session);
    returns (exit status, output). test_as_written runs its command line."""
    return run_main(train_dlrm.main, argv)


def run_main(main, argv: list[str]) -> tuple[int, str]:
    """``dist_launch.run_here`` of a script's ``main`` with the session's
    one forkserver and log; returns (exit status, output)."""
    return dist_launch.run_here(main, argv, _LOG)


def torchrun_cmd(torchrun_args: list[str], argv: list[str]) -> list[str]:
    """The command of one torchrun agent running the job."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun_args,
        train_dlrm.__file__,
        *argv,
    ]


def run_torchrun(
    torchrun_args: list[str], argv: list[str], timeout: float = RUN_TIMEOUT_S
) -> tuple[int, str]:
    """Runs the job under one torchrun agent; returns (exit status, output)."""
    return _run(torchrun_cmd(torchrun_args, argv), timeout)


def summary(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# What two runs of the same training agree on, in their summaries.
FIGURES = (
    "train_loss_first",
    "train_loss_last",
    "train_loss_checkpoints",
    "eval_loss_first",
    "eval_auc_first",
    "eval_loss_final",
    "eval_auc_final",
)


def assert_same_figures(got: dict, want: dict, what: str, more: tuple[str, ...] = ()) -> None:
    for k in FIGURES + more:
        assert got[k] == want[k], f"{what}: {k}: {got[k]} vs {want[k]}"


def steps_in(root: str) -> list[int]:
    """The complete checkpoints of ``root``, by step."""
    return [f.step for f in train_checkpoint.complete(root)]


# ------------------------------------------------------------ checkpoints --


def _read(path: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return (
        torch.frombuffer(data, dtype=dtype).reshape(shape).clone()
        if data
        else torch.empty(shape, dtype=dtype)
    )


_FLOATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _values_of(meta: dict) -> tuple[torch.dtype, tuple[int, ...], Callable]:
    """(file dtype, row shape, to float values) of a table's embeddings."""
    dim, name = meta["embedding_dim"], meta["embedding_dtype"]
    if name == "float8_e4m3fn":
        return torch.uint8, (pad4(dim) + 4,), lambda rows: fp8_values(rows, dim)
    return _FLOATS[name], (dim,), lambda rows: rows


def read_tables(folder: str) -> dict[str, dict[str, torch.Tensor]]:
    """Every dynamic table of a DynamicEmbDump folder, all ranks' rows
    merged, sorted by key: table -> keys, emb (at the table's dtype; FP8 rows
    as float32 values), opt, scores."""
    with open(os.path.join(folder, "dynamicemb_checkpoint.json")) as f:
        manifest = json.load(f)
    out = {}
    for coll, tables in manifest["collections"].items():
        for name in tables:
            with open(os.path.join(folder, coll, f"{name}_meta.json")) as f:
                meta = json.load(f)
            values_dtype, values_shape, as_values = _values_of(meta)
            cols = {
                "keys": (torch.int64, ()),
                "values": (values_dtype, values_shape),
                "opt_values": (_FLOATS[meta["optim_state_dtype"]], (meta["optim_state_dim"],)),
                "scores": (torch.int64, (len(meta["score_strategy"]),)),
            }
            parts: dict[str, list[torch.Tensor]] = {c: [] for c in cols}
            for shard in meta["shards"]:
                for c, (dtype, width) in cols.items():
                    info = shard["files"][c]
                    parts[c].append(
                        _read(
                            os.path.join(folder, coll, info["file"]), dtype, (shard["rows"], *width)
                        )
                    )
            merged = {c: torch.cat(p) for c, p in parts.items()}
            order = torch.argsort(merged["keys"])
            out[name] = {
                "keys": merged["keys"][order],
                "emb": as_values(merged["values"][order]),
                "opt": merged["opt_values"][order],
                "scores": merged["scores"][order],
            }
    return out


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_checkpoint(path: str, tmp: str) -> dict:
    """A job checkpoint's contents: "tables" (read_tables), "torchrec" (every
    DCP entry by its flattened name: dense parameters, static tables and
    their optimizer state, whole), "dense_optim" (the dense optimizer's
    state tensors, flattened), "manifest" (job.json)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    converted = os.path.join(tmp, f"{os.path.basename(path)}-{os.getpid()}.pt")
    dcp_to_torch_save(os.path.join(path, train_checkpoint.TORCHREC), converted)
    trainer = torch.load(os.path.join(path, train_checkpoint.TRAINER), weights_only=True)
    with open(os.path.join(path, train_checkpoint.MANIFEST)) as f:
        manifest = json.load(f)
    return {
        "tables": read_tables(os.path.join(path, train_checkpoint.TABLES)),
        "torchrec": _flatten(torch.load(converted, weights_only=False)),
        "dense_optim": _flatten(trainer["dense_optim"]["state"]),
        "loss_sum": trainer["loss_sum"],
        "manifest": manifest,
    }


def assert_same_state(got: dict, want: dict, what: str) -> None:
    """Two checkpoints hold the same model state, bit for bit: every table's
    keys, rows, optimizer state and scores, every TorchRec tensor, the dense
    optimizer's state and the loss history."""
    assert sorted(got["tables"]) == sorted(want["tables"]), what
    for name, w in want["tables"].items():
        g = got["tables"][name]
        for c in ("keys", "emb", "opt", "scores"):
            assert torch.equal(g[c], w[c]), f"{what}: table {name}: {c} differ"
    assert sorted(got["torchrec"]) == sorted(want["torchrec"]), what
    for k, w in want["torchrec"].items():
        assert torch.equal(got["torchrec"][k], w), f"{what}: {k} differs"
    assert sorted(got["dense_optim"]) == sorted(want["dense_optim"]), what
    for k, w in want["dense_optim"].items():
        assert torch.equal(torch.as_tensor(got["dense_optim"][k]), torch.as_tensor(w)), (
            f"{what}: dense optimizer state {k} differs"
        )
    assert torch.equal(got["loss_sum"], want["loss_sum"]), f"{what}: loss history differs"
