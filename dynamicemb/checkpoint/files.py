"""Files of a checkpoint: checksummed writes and reads, and publishing a
finished checkpoint atomically.

A dump writes into a sibling folder ``<path>.dynamicemb-tmp-<token>``,
fsyncs every file and folder, writes the manifest last, and only then puts
the folder at ``<path>``: a plain rename when ``<path>`` does not exist, else
rename ``<path>`` to ``<path>.dynamicemb-old-<token>``, rename the new folder
to ``<path>``, fsync the parent and remove the old one. A crash between the
two renames leaves no ``<path>`` but two complete siblings; ``resolve`` (what
a load reads) then takes the newest complete one, and the next dump puts it
back at ``<path>`` before anything else. So ``<path>`` reads as the previous
checkpoint or the new one, never as a mixture or a torn one.
"""

import os
import shutil
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import torch

from dynamicemb.checkpoint.layout import (
    MANIFEST,
    CheckpointError,
    FileInfo,
    decode_manifest,
    encode_manifest,
)

TMP_TAG = ".dynamicemb-tmp-"
OLD_TAG = ".dynamicemb-old-"


def new_token() -> str:
    return f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def fsync_path(path: str) -> None:
    """fsync of a file or folder by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckedWriter:
    """Writes one file, computing the CRC-32 of every ``block`` bytes.

    ``close`` flushes and fsyncs the file and returns its ``FileInfo``.
    """

    def __init__(self, path: str, block: int) -> None:
        self.path = path
        self.block = block
        self.f = open(path, "wb")
        self.nbytes = 0
        self.crcs: list[int] = []
        self._crc = 0  # CRC of the current, unfinished block

    def write(self, data: memoryview | bytes) -> None:
        mv = memoryview(data).cast("B")
        self.f.write(mv)
        pos = 0
        while pos < len(mv):
            fill = self.nbytes % self.block
            take = min(self.block - fill, len(mv) - pos)
            self._crc = zlib.crc32(mv[pos : pos + take], self._crc)
            pos += take
            self.nbytes += take
            if self.nbytes % self.block == 0:
                self.crcs.append(self._crc)
                self._crc = 0

    def close(self) -> FileInfo:
        if self.nbytes % self.block:
            self.crcs.append(self._crc)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return FileInfo(os.path.basename(self.path), self.nbytes, self.crcs)

    def abort(self) -> None:
        self.f.close()


def read_verified(folder: str, info: FileInfo, block: int, what: str, out) -> None:
    """Reads the file ``info`` names into ``out`` (a contiguous tensor of
    exactly its size) and verifies the CRC-32 of every ``block`` bytes
    (``info.crc32`` None, the legacy layout: none)."""
    path = os.path.join(folder, info.name)
    mv = memoryview(out.reshape(-1).view(torch.uint8).numpy())
    if len(mv) != info.nbytes:
        raise CheckpointError(f"{what}: {path}: {len(mv)} bytes expected, {info.nbytes} recorded")
    got = 0
    try:
        with open(path, "rb") as f:
            while got < len(mv):
                n = f.readinto(mv[got:])
                if not n:
                    break
                got += n
    except FileNotFoundError:
        raise CheckpointError(f"{what}: {path} does not exist") from None
    if got != info.nbytes:
        raise CheckpointError(
            f"{what}: {path} is truncated: {got} bytes, the meta JSON records {info.nbytes}"
        )
    if info.crc32 is None:
        return
    starts = range(0, info.nbytes, block)
    if len(starts) != len(info.crc32):
        raise CheckpointError(
            f"{what}: {path}: the meta JSON lists {len(info.crc32)} checksums for "
            f"{len(starts)} blocks"
        )
    for i, lo in enumerate(starts):
        if zlib.crc32(mv[lo : lo + block]) != info.crc32[i]:
            raise CheckpointError(
                f"{what}: {path} is corrupted: checksum mismatch in block {i} "
                f"(bytes {lo}..{min(lo + block, info.nbytes)})"
            )


# ----------------------------------------------------------- publishing --


def _siblings(path: str, tag: str) -> list[str]:
    parent, base = os.path.split(os.path.abspath(path))
    if not os.path.isdir(parent):
        return []
    return [os.path.join(parent, n) for n in sorted(os.listdir(parent)) if n.startswith(base + tag)]


def _read_whole(path: str, prefix: str) -> bytes:
    """All of ``path``; a missing file is a ``CheckpointError`` that starts
    with ``prefix``."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{prefix}{path} does not exist") from None


def read_manifest(folder: str, manifest: str = MANIFEST, **fmt) -> dict[str, Any]:
    """The checked body of ``folder``'s manifest (a checkpoint's, unless
    ``manifest`` and ``fmt``, ``decode_manifest``'s format and version, say
    otherwise)."""
    where = os.path.join(folder, manifest)
    return decode_manifest(_read_whole(where, ""), where, **fmt)


def _complete(folder: str) -> dict[str, Any] | None:
    try:
        return read_manifest(folder)
    except (CheckpointError, OSError):
        return None


def resolve(path: str) -> tuple[str, dict[str, Any] | None]:
    """The folder a load reads for ``path`` and its manifest (None: a legacy
    checkpoint). Reads only; see the module docstring.

    Raises:
        CheckpointError: no checkpoint at ``path``.
    """
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path, read_manifest(path)
    if os.path.isdir(path):
        return path, None  # legacy layout, or not a checkpoint (the load says which)
    candidates = []
    for folder in _siblings(path, TMP_TAG) + _siblings(path, OLD_TAG):
        manifest = _complete(folder)
        if manifest is not None:
            candidates.append((int(manifest["created_unix_ns"]), folder, manifest))
    if not candidates:
        raise CheckpointError(f"no dynamicemb checkpoint at {path!r}: it does not exist")
    _, folder, manifest = max(candidates)
    return folder, manifest


def prepare_target(path: str) -> None:
    """Makes ``path`` ready for a dump to replace: puts back a checkpoint a
    crash left beside it, removes unfinished siblings. Changes nothing and
    raises when ``path`` holds something that is not a dynamicemb
    checkpoint (a file, or a folder that is neither empty nor a checkpoint).
    """
    path = os.path.abspath(path)
    if os.path.lexists(path):
        if not os.path.isdir(path) or os.path.islink(path):
            raise ValueError(f"cannot dump to {path!r}: it exists and is not a folder")
        if os.listdir(path) and not os.path.isfile(os.path.join(path, MANIFEST)):
            raise ValueError(
                f"cannot dump to {path!r}: it holds files but no dynamicemb checkpoint "
                f"({MANIFEST}); dump to a new or empty folder"
            )
    else:
        try:
            folder, _ = resolve(path)
        except CheckpointError:
            folder = None
        if folder is not None:
            os.rename(folder, path)  # a crash left the newest complete one beside it
            fsync_path(os.path.dirname(path))
    for folder in _siblings(path, TMP_TAG) + _siblings(path, OLD_TAG):
        shutil.rmtree(folder, ignore_errors=True)


def make_tmp(path: str) -> str:
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = path + TMP_TAG + new_token()
    os.mkdir(tmp)
    return tmp


def write_manifest(tmp: str, body: dict[str, Any], manifest: str = MANIFEST) -> None:
    """Writes the manifest (``manifest``, a checkpoint's by default) into
    ``tmp`` and fsyncs it and the folder: the last write before publishing."""
    body = dict(body, created_unix_ns=time.time_ns())
    name = os.path.join(tmp, manifest)
    with open(name, "wb") as f:
        f.write(encode_manifest(body))
        f.flush()
        os.fsync(f.fileno())
    fsync_path(tmp)


def publish(tmp: str, path: str) -> None:
    """Puts the finished folder ``tmp`` at ``path`` (see the module docstring)."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    fsync_path(parent)  # the tmp folder's own entry
    if os.path.lexists(path):
        old = path + OLD_TAG + new_token()
        os.rename(path, old)
        os.rename(tmp, path)
        fsync_path(parent)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)
        fsync_path(parent)


def write_small(folder: str, name: str, data: bytes) -> FileInfo:
    """A whole small file (meta JSON), fsynced; returns its info with a
    single CRC-32 over all of it."""
    full = os.path.join(folder, name)
    with open(full, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return FileInfo(name, len(data), [zlib.crc32(data)])


def read_small(folder: str, info: FileInfo | None, name: str, what: str) -> bytes:
    full = os.path.join(folder, name)
    data = _read_whole(full, f"{what}: ")
    if info is not None and (len(data) != info.nbytes or [zlib.crc32(data)] != info.crc32):
        raise CheckpointError(
            f"{what}: {full} is corrupted or truncated ({len(data)} bytes, checksum mismatch "
            f"with the manifest's {info.nbytes} bytes)"
        )
    return data


def check_sizes(folder: str, infos: list[FileInfo], what: str) -> None:
    """Every file exists with the size its meta records (a truncated or
    missing file is reported before anything is read)."""
    for info in infos:
        full = os.path.join(folder, info.name)
        try:
            size = os.stat(full).st_size
        except FileNotFoundError:
            raise CheckpointError(f"{what}: {full} does not exist") from None
        if size != info.nbytes:
            raise CheckpointError(
                f"{what}: {full} has {size} bytes, the meta JSON records {info.nbytes} "
                f"({'truncated' if size < info.nbytes else 'extended'})"
            )


# ------------------------------------------------------------- progress --

# Dumps and loads of fewer bytes than this show no progress bar.
PROGRESS_MIN_BYTES = 64 << 20


class Progress:
    """A tqdm bar in bytes on rank 0 for large transfers; ``update`` is
    thread-safe enough for a count (tqdm locks)."""

    def __init__(self, desc: str, total: int, show: bool) -> None:
        self.bar = None
        self.start = time.perf_counter()
        if show and total >= PROGRESS_MIN_BYTES:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
        return time.perf_counter() - self.start


def run_tasks(tasks: list[Callable[[], Any]], pool) -> list[Any]:
    """Runs callables on ``pool`` (None: inline) and returns their results,
    re-raising the first failure after all have finished."""
    if pool is None:
        return [t() for t in tasks]
    futures = [pool.submit(t) for t in tasks]
    results, error = [], None
    for fut in futures:
        try:
            results.append(fut.result())
        except BaseException as e:  # every task finishes before the error propagates
            error = error or e
    if error is not None:
        raise error
    return results
