"""Checkpoints of the main job (examples/train_dlrm.py): all a killed job
needs to go on where it stopped, one folder per checkpoint, each published
atomically.

    <checkpoint-dir>/
      step_00000120/       after 120 steps
        tables/            the dynamic tables with their optimizer state and
                           scores: DynamicEmbDump(optim=True) (docs/checkpoint.md)
        torchrec/          torch.distributed.checkpoint (DCP) of the model's
                           state_dict() (the dense parameters and TorchRec's
                           static tables) and of the fused optimizer's state
                           of the static tables
        trainer.pt         the dense optimizer's state, every rank's RNG state,
                           the loss history, the first evaluation, the data
                           position (torch.save, read with weights_only=True)
        job.json           the manifest, written last: the step, the world
                           size, the model and data the checkpoint belongs
                           to, and the size and CRC-32s of trainer.pt and of
                           every file in torchrec/

Why two formats: the dynamic tables are hash tables, not tensors. A sharded model's
state_dict() can carry their rows into DCP, but DynamicEmbDump writes them checksummed,
verifies everything before a load changes a table, carries the admission counters, and
reshards by key to any world size; so the state dict given to DCP here leaves them out
(state_dict_without_rows). The rest is what TorchRec and torch already checkpoint well:
DCP reshards the static tables' sharded tensors, and saves a replicated dense tensor
once. Nothing read back runs code: DCP's folder is read with
``dynamicemb.checkpoint.dcp_reader`` (DCP's own reader would unpickle its files),
``trainer.pt`` with ``weights_only=True``.

Publishing: every rank writes into ``step_<N>.dynamicemb-tmp-<token>``; when
all have finished, rank 0 writes ``job.json`` (fsynced) and renames the
folder to ``step_<N>`` (the library's ``make_tmp`` / ``write_manifest`` /
``publish``). A folder is a checkpoint when its name is ``step_<N>`` and its
``job.json`` is whole (its own checksum); anything else (a temporary folder
of a killed job, a folder being pruned) is ignored, and removed by rank 0 at
the next save. ``--keep K`` keeps the K newest checkpoints: an older one
loses its ``job.json`` first, so a prune cut short leaves no folder that
reads as a checkpoint. One job writes to a folder at a time: rank 0 holds
``.dynamicemb-job-lock`` (its host and process) while the job runs, and a
second job on the folder is refused naming it; a lock whose process is gone
(a killed job, on the same host) is taken over. Every rank must see the
folder (a shared filesystem on several nodes, or an object store, where the
lock is written when absent, without an atomic create).

A resume loads the newest complete checkpoint; one that cannot be loaded (a
damaged file: a CRC-32 that does not match, a DCP folder that cannot be
read) is named and skipped for the next older one (``--keep``), so an
automatic restart goes on from it.

``--checkpoint-dir`` may be an fsspec URL (``s3://bucket/run``): there a
checkpoint is written into ``step_<N>/.dynamicemb-version-<n>/`` and its
``job.json``, written last, commits it (nothing can be renamed in an object
store; ``dynamicemb.io.files``). DCP writes its part through its fsspec
writer.
"""

import io
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

FORMAT = "dynamicemb-train-job"
VERSION = 1
MANIFEST = "job.json"
# The job writing to a --checkpoint-dir: its host, process and start.
LOCK = ".dynamicemb-job-lock"
TABLES = "tables"
TORCHREC = "torchrec"
TRAINER = "trainer.pt"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


def _io():
    """The library's verified files, atomic publishing and agreed collectives
    (imported when first needed: they bring TorchRec in)."""
    from dynamicemb.io import comm, files

    return comm, files


def _store(path: str):
    """The filesystem of ``path`` (a local folder or an object store URL)."""
    from dynamicemb.io import fs

    return fs.of(path)


class JobError(RuntimeError):
    """The job cannot start or go on as asked; nothing was changed."""


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:08d}")


@dataclass(frozen=True)
class Found:
    """A complete checkpoint: its step, folder and manifest."""

    step: int
    path: str
    manifest: dict[str, Any]


def _manifest(folder: str) -> dict[str, Any] | None:
    _, files = _io()
    try:
        return files.read_manifest(folder, MANIFEST, fmt=FORMAT, version=VERSION)
    except (RuntimeError, OSError, ValueError):
        return None  # not (yet, or any more) a checkpoint


def complete(root: str) -> list[Found]:
    """The complete checkpoints in ``root``, oldest first (reads only)."""
    _, files = _io()
    out = []
    for name, path in files.committed_children(root, MANIFEST).items():
        m = _STEP_DIR.match(name)
        if m is None:
            continue
        body = _manifest(path)
        if body is not None and int(body["step"]) == int(m.group(1)):
            out.append(Found(int(m.group(1)), path, body))
    return sorted(out, key=lambda f: f.step)


@dataclass(frozen=True)
class Resumed:
    """A job resumed from a checkpoint: the step it goes on after, the
    trainer state saved with it (``loss_sum``, ``eval_first``,
    ``data_position``) and the summary's "resumed" entry."""

    step: int
    trainer: dict[str, Any]
    entry: dict[str, Any]


def _differences(want: Any, got: Any, where: str = "") -> list[str]:
    """Where two JSON values differ, as "<where>: <want> (checkpoint) vs <got>"."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            out += _differences(want.get(k), got.get(k), f"{where}.{k}" if where else k)
        return out
    if want != got:
        return [f"{where}: {want} (checkpoint) vs {got} (this job)"]
    return []


def check_dir(root: str, resume: bool, model: dict, data: dict) -> Found | None:
    """Checks ``--checkpoint-dir`` before a job starts (what every rank does
    with the same verdict): it is a folder or can be made one, it holds no
    checkpoint unless the job resumes, and the newest checkpoint is of this
    model and data. Returns the checkpoint a resume starts from (None: none
    yet, the job starts at step 0).

    Raises:
        JobError: naming the path or the differences.
    """
    try:
        store = _store(root)
    except (ImportError, ValueError) as e:
        raise JobError(f"--checkpoint-dir {e}") from None
    if not store.renames:
        _check_store(store, root)
    elif os.path.lexists(store.absolute(root)) and not os.path.isdir(store.absolute(root)):
        raise JobError(f"--checkpoint-dir {root}: exists and is not a folder")
    else:
        root = store.absolute(root)
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as e:
            raise JobError(f"--checkpoint-dir {root}: cannot be made ({e.strerror})") from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise JobError(f"--checkpoint-dir {root}: not writable")
    found = complete(root)
    if not found:
        return None
    newest = found[-1]
    if not resume:
        raise JobError(
            f"--checkpoint-dir {root} holds checkpoints (the newest after step {newest.step}): "
            "pass --resume to go on from it, or name a new folder"
        )
    check_matches(newest, model, data)
    return newest


def _check_store(store, root: str) -> None:
    """An object store URL: not an object, and writable (a probe object is
    written and removed)."""
    _, files = _io()
    if store.isfile(root):
        raise JobError(f"--checkpoint-dir {root}: exists and is not a folder (an object)")
    probe = os.path.join(root, f".dynamicemb-probe-{files.new_token()}")
    try:
        store.write_bytes(probe, b"")
        store.remove(probe)
    except Exception as e:  # the store's own error: no bucket, no credentials, ...
        why = f"{type(e).__name__}: {e}"
        raise JobError(f"--checkpoint-dir {root}: cannot be written ({why})") from None


def check_matches(found: Found, model: dict, data: dict) -> None:
    """Raises JobError when ``found`` belongs to another model or data."""
    diffs = _differences(found.manifest["model"], model, "model")
    diffs += _differences(found.manifest["data"], data, "data")
    if diffs:
        raise JobError(
            f"the checkpoint {found.path} is of another model or data than this job: "
            + "; ".join(diffs)
            + " (resume with the options it was written with, or start a new --checkpoint-dir)"
        )


def _file_infos(folder: str) -> list[dict[str, Any]]:
    """Size and CRC-32s of every file in ``folder`` (as the meta JSONs of
    DynamicEmbDump record them)."""
    _, files = _io()
    store = _store(folder)
    infos = []
    for name in store.listdir(folder):
        data = store.read_bytes(os.path.join(folder, name))
        crcs = files.crc32_blocks(data, files.CHECKSUM_BLOCK_BYTES)
        infos.append(files.FileInfo(name, len(data), crcs).to_json())
    return infos


def _verify(folder: str, infos: list[dict[str, Any]], what: str) -> None:
    """Every file of ``_file_infos`` there, whole and unchanged."""
    _, files = _io()
    infos = [files.FileInfo.from_json(i) for i in infos]
    files.check_sizes(folder, infos, what)
    for info in infos:
        out = torch.empty(info.nbytes, dtype=torch.uint8)
        files.read_verified(folder, info, files.CHECKSUM_BLOCK_BYTES, what, out)


def _pruned(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without its empty dicts, at any depth (the same objects
    otherwise, so DCP loads into the model's own tensors)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = _pruned(v)
            if not v:
                continue
        out[k] = v
    return out


def _gone(owner: dict[str, Any]) -> bool:
    """Whether the job a ``LOCK`` names has ended: its process is gone (on
    this host; a job on another host is taken as alive)."""
    import socket

    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _rng_state(device: torch.device) -> dict[str, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


class JobCheckpoints:
    """Saving and finding the checkpoints of ``root`` over the default
    process group; ``keep`` the number kept (0: all)."""

    def __init__(self, root: str, keep: int, device: torch.device) -> None:
        self.named = root  # as the job was given it
        self.root = _store(root).absolute(root)
        self.keep = keep
        self.device = device
        comm, _ = _io()
        self.group = comm.Group(None)

    def claim(self) -> None:
        """Makes this job the one writing to the folder (every rank calls
        it): rank 0 creates ``LOCK`` (local files: exclusively; an object
        store: when absent), taking over one whose process is gone (same
        host, no such process: a job killed, restarted by its launcher).

        Raises:
            JobError: another job holds the folder (named), on every rank.
        """
        error = None
        if self.group.rank == 0:
            try:
                self._lock()
            except JobError as e:
                error = e
            except Exception as e:  # the store's own error
                error = JobError(f"--checkpoint-dir {self.named}: cannot take its lock ({e})")
        self.group.verdict(error)  # the same JobError on every rank

    def release(self) -> None:
        """Removes this job's ``LOCK`` (rank 0; every rank may call it)."""
        if self.group.rank == 0 and self._locked:
            _store(self.root).remove(os.path.join(self.root, LOCK))
            self._locked = False

    _locked = False

    def _lock(self) -> None:
        import json
        import socket

        store = _store(self.root)
        store.makedirs(self.root)
        path = os.path.join(self.root, LOCK)
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        for _ in range(2):
            if store.renames:
                try:
                    fd = os.open(store.absolute(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    pass
                else:
                    with os.fdopen(fd, "w") as f:
                        json.dump(mine, f)
                    self._locked = True
                    return
            elif not store.exists(path):
                store.write_bytes(path, json.dumps(mine).encode())
                self._locked = True
                return
            try:
                owner = json.loads(store.read_bytes(path))
            except (OSError, ValueError):
                owner = {}
            if not _gone(owner):
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
                raise JobError(
                    f"--checkpoint-dir {self.named} is in use by another job (host "
                    f"{owner.get('host')}, process {owner.get('pid')}, since {since}): two jobs "
                    f"writing one folder would overwrite each other's checkpoints; wait for it "
                    f"to end, or remove {path} if it is gone"
                )
            store.remove(path)  # its job is gone: take the folder over
        raise JobError(f"--checkpoint-dir {self.named}: cannot take {path}")

    def newest(self) -> Found | None:
        """Rank 0's newest complete checkpoint, on every rank."""
        found = self.all_complete()
        return found[-1] if found else None

    def all_complete(self) -> list[Found]:
        """Rank 0's complete checkpoints, oldest first, on every rank."""
        found = complete(self.root) if self.group.rank == 0 else None
        return self.group.broadcast_object(found)

    def resume(
        self,
        model: torch.nn.Module,
        dense_opt: torch.optim.Optimizer,
        model_desc: dict,
        data_desc: dict,
        dense_lr: float,
        batch_size: int,
    ) -> Resumed | None:
        """--resume (every rank calls it): loads the newest complete
        checkpoint into the model and the dense optimizer (``load``) once it
        is found to be of this model and data; the dense optimizer's learning
        rate is then ``dense_lr`` (the command line's). Rank 0 says where it
        resumed from and, at another world size, how the job was resharded
        (``batch_size`` examples per rank).

        A checkpoint that cannot be loaded (a damaged file: every rank finds
        so alike) is skipped for the next older complete one (``--keep``), so
        an automatic restart goes on from it; a load that changed part of the
        model before it failed is overwritten whole by the older one's.

        Returns:
            The resume, or None when there is no checkpoint yet (rank 0 says
            so): the job starts at step 0.

        Raises:
            JobError: the newest checkpoint is of another model or data, or
                none of the complete checkpoints can be loaded (each named).
        """
        candidates = self.all_complete()
        if not candidates:
            if self.group.rank == 0:
                print(f"--resume: no checkpoint in {self.named} yet, starting at step 0")
            return None
        check_matches(candidates[-1], model_desc, data_desc)
        t0 = time.perf_counter()
        failed = []
        for found in reversed(candidates):
            try:
                check_matches(found, model_desc, data_desc)
                trainer, report = self.load(found, model, dense_opt)
                break
            except Exception as e:  # agreed: every rank fails the same load
                failed.append(f"{found.path}: {e}")
                if self.group.rank == 0:
                    print(f"--resume: cannot load {found.path} ({e})", flush=True)
        else:
            raise JobError("--resume: no checkpoint can be loaded: " + "; ".join(failed))
        for group in dense_opt.param_groups:
            group["lr"] = dense_lr
        dropped = {t.table: t.dropped for t in report.tables} if report is not None else {}
        entry = {
            "path": found.path,
            "step": found.step,
            "world_size": found.manifest["world_size"],
            "seconds": time.perf_counter() - t0,
            "rows_dropped": dropped,
        }
        world_size = self.group.world_size
        if self.group.rank == 0:
            print(
                f"resumed from {found.path} (after step {found.step}, written at world size "
                f"{entry['world_size']}) in {entry['seconds']:.2f} s",
                flush=True,
            )
            if entry["world_size"] != world_size:
                lost = ", ".join(f"{n} {d}" for n, d in dropped.items() if d) or "none"
                print(
                    f"  resharded from {entry['world_size']} to {world_size} ranks: the "
                    f"global batch is now {batch_size * world_size}; rows that did not "
                    f"fit: {lost}"
                )
        return Resumed(found.step, trainer, entry)

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        dense_opt: torch.optim.Optimizer,
        trainer: dict[str, Any],
        body: dict[str, Any],
        hook: Callable[[str], None] = lambda point: None,
    ) -> tuple[str, float]:
        """Writes the checkpoint after ``step`` steps (every rank calls it):
        the tables, the TorchRec state, ``trainer`` (on rank 0's, with the
        dense optimizer's state and every rank's RNG state) and the manifest
        ``body`` (the model and data descriptions), then publishes it and
        prunes. ``hook(point)`` is called at "dump" (the dynamic tables
        written, nothing else) and "published".

        Returns:
            (the checkpoint's folder, seconds).
        """
        import torch.distributed.checkpoint as dcp

        from dynamicemb.checkpoint import dump

        _, files = _io()
        start = time.perf_counter()
        g = self.group
        path = step_dir(self.root, step)
        error, tmp = None, None
        if g.rank == 0:
            try:
                self._remove_leftovers()
                tmp = files.make_tmp(path)
            except BaseException as e:
                error = e
        g.agree(error)
        tmp = g.broadcast_object(tmp)
        try:
            dump(os.path.join(tmp, TABLES), model, optim=True, show_progress=False)
            hook("dump")
            dcp.save(self._torchrec_state(model), checkpoint_id=os.path.join(tmp, TORCHREC))
            rng = g.all_gather_object(_rng_state(self.device))
            if g.rank == 0:
                trainer = {**trainer, "dense_optim": dense_opt.state_dict(), "rng": rng}
                error = self._commit(tmp, path, step, trainer, body)
                tmp = tmp if error else None
            g.agree(error)
        finally:
            if g.rank == 0 and tmp is not None:
                _store(tmp).rmtree(tmp)
        hook("published")
        if g.rank == 0:
            self._prune()
        return path, time.perf_counter() - start

    def _commit(
        self, tmp: str, path: str, step: int, trainer: dict[str, Any], body: dict[str, Any]
    ) -> BaseException | None:
        """Rank 0, once every rank has written its part: ``trainer.pt``, then
        the manifest, then the rename to ``path``. Returns what failed."""
        _, files = _io()
        try:
            buf = io.BytesIO()
            torch.save(trainer, buf)
            info = files.write_small(tmp, TRAINER, buf.getvalue())
            manifest = {
                **body,
                "format": FORMAT,
                "version": VERSION,
                "step": step,
                "world_size": self.group.world_size,
                "trainer": info.to_json(),
                "torchrec": _file_infos(os.path.join(tmp, TORCHREC)),
            }
            files.write_manifest(tmp, manifest, MANIFEST)
            files.publish(tmp, path)
        except BaseException as e:
            return e
        return None

    def load(
        self, found: Found, model: torch.nn.Module, dense_opt: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], Any]:
        """Loads ``found`` into the model and the dense optimizer, at any
        world size, and restores this rank's RNG state (that of the same
        rank, when the checkpoint's world had it). Everything is verified
        before the model changes.

        Returns:
            (the trainer state saved with it, the tables' LoadReport).
        """
        from dynamicemb.checkpoint import load, state_dict_without_rows
        from dynamicemb.checkpoint.dcp_reader import dcp_load

        _, files = _io()
        g = self.group
        m = found.manifest
        info = files.FileInfo.from_json(m["trainer"])
        what = f"checkpoint {found.path}"
        error = None
        try:
            data = files.read_small(found.path, info, TRAINER, what)
            if g.rank == 0:
                _verify(os.path.join(found.path, TORCHREC), m["torchrec"], what)
            trainer = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except BaseException as e:
            error = e
        g.agree(error)
        report = load(os.path.join(found.path, TABLES), model, optim=True, show_progress=False)
        state = self._torchrec_state(model)
        # DCP's own reader would unpickle the folder's files: a crafted
        # checkpoint would run code (its CRC-32s, recomputable, authenticate
        # nothing). dcp_load reads with dcp_reader, which runs none, and names
        # the folder and what failed (every rank alike).
        dcp_load(state, os.path.join(found.path, TORCHREC))
        with state_dict_without_rows():  # the tables were loaded from tables/
            model.load_state_dict(state["model"])
        if "fused_optim" in state:
            model.fused_optimizer.load_state_dict(state["fused_optim"])
        dense_opt.load_state_dict(trainer.pop("dense_optim"))
        rng = trainer.pop("rng")
        if g.rank < len(rng):
            torch.set_rng_state(rng[g.rank]["cpu"])
            if self.device.type == "cuda" and rng[g.rank]["cuda"] is not None:
                torch.cuda.set_rng_state(rng[g.rank]["cuda"], self.device)
        return trainer, report

    @staticmethod
    def _torchrec_state(model: torch.nn.Module) -> dict[str, Any]:
        """What DCP saves and loads: the model's state_dict() and the fused
        optimizer's (a rank that holds no static table has no state there:
        its empty dicts are left out, as DCP has nothing to match them to).
        The dynamic tables' rows are left out of it: they are saved beside
        it, in ``tables/``."""
        from dynamicemb.checkpoint import state_dict_without_rows

        with state_dict_without_rows():
            sd = model.state_dict()
        return _pruned({"model": sd, "fused_optim": model.fused_optimizer.state_dict()})

    def _remove_leftovers(self) -> None:
        """Removes what killed saves and prunes left (rank 0, before a save)."""
        _, files = _io()
        store = _store(self.root)
        store.makedirs(self.root)
        for name in store.listdir(self.root):
            path = os.path.join(self.root, name)
            base = name.split(".dynamicemb-", 1)[0]
            if not _STEP_DIR.match(base) or not store.isdir(path):
                continue
            folder = files.committed(path, MANIFEST)
            if base != name or folder is None or _manifest(folder) is None:
                store.rmtree(path)

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        store = _store(self.root)
        for old in complete(self.root)[: -self.keep]:
            store.remove(os.path.join(old.path, MANIFEST))  # no longer a checkpoint
            _io()[1].fsync_path(old.path)
            store.rmtree(step_dir(self.root, old.step))
