"""Files written checksummed and read back verified, and folders published
atomically.

A writer (``CheckedWriter``) records a file's size and the CRC-32 (zlib's)
of every ``block`` bytes in a ``FileInfo``; a reader (``read_verified``)
refuses a missing, truncated or corrupted file before its bytes are used. A
manifest (``encode_manifest``) is a JSON body with the CRC-32 of its own
canonical form, a format name and a version.

Publishing: a folder is written aside as ``<path>.dynamicemb-tmp-<token>``
(``make_tmp``), every file and folder fsynced, its manifest written last
(``write_manifest``), and only then put at ``<path>`` (``publish``): a plain
rename when ``<path>`` does not exist, else rename ``<path>`` to
``<path>.dynamicemb-old-<token>``, rename the new folder to ``<path>``,
fsync the parent and remove the old one. A reader sees the folder whole or
not at all; a crash between the two renames leaves two complete siblings
(``siblings``), from which the format that published them recovers.

An object store (a URL, ``fs.py``) has no rename. There ``make_tmp`` gives
a new version prefix inside ``<path>``, ``<path>/.dynamicemb-version-<n>``
(``n`` above every version there, committed or not); the folder is written
into it, its manifest last, and the manifest commits it: the committed
version of ``<path>`` (``committed``) is the highest-numbered one holding
its manifest. ``publish`` then removes everything else in ``<path>`` (older
versions, unfinished ones). No object is ever overwritten, so a reader sees
the previous version or the new one, whole; docs/checkpoint.md has the
argument. Readers find a folder's files through ``committed``.

Every reader raises its ``error`` argument's class (``DataError`` by
default), so each format reports bad data in its own terms. Paths are taken
as ``fs.Location``s (a plain path is resolved to its filesystem where it
enters, ``fs.at``), and the paths made from them keep their filesystem.
"""

import json
import os
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb.io import fs

# CRC-32 block size of new files (readers use the value recorded with them).
CHECKSUM_BLOCK_BYTES = 64 << 20
CHECKSUM_ALGORITHM = "crc32"
# Rows of one chunk of a transfer are sized to about this many bytes.
CHUNK_BYTES = 32 << 20
# Threads writing (and checksumming) files; both release the GIL.
IO_THREADS = min(8, os.cpu_count() or 1)
# Transfers of fewer bytes than this show no progress bar.
PROGRESS_MIN_BYTES = 64 << 20

TMP_TAG = ".dynamicemb-tmp-"
OLD_TAG = ".dynamicemb-old-"
# An object store's versions of a folder: <path>/<VERSION_TAG><n>.
VERSION_TAG = ".dynamicemb-version-"
_VERSION = re.compile(r"^" + re.escape(VERSION_TAG) + r"(\d+)$")


class DataError(RuntimeError):
    """Data read back that is missing, truncated, corrupted or not of the
    expected format (the default error of the readers here)."""


ErrorType = type[Exception]


def chunk_rows(row_bytes: int) -> int:
    """Rows of ``row_bytes`` bytes in one chunk of a transfer (``CHUNK_BYTES``,
    at least 1024 rows)."""
    return max(1024, CHUNK_BYTES // max(row_bytes, 1))


def host_bytes(t: torch.Tensor) -> memoryview:
    """A CPU copy of ``t`` as raw little-endian bytes, row-major."""
    t = t.detach().contiguous().cpu()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def check_name(name: str, what: str) -> None:
    """Refuses a name that cannot name a file (empty, with a ``/``, ...)."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"{what} {name!r} cannot name a file")


def crc32_blocks(data: memoryview | bytes, block: int, start: int = 0) -> list[int]:
    """CRC-32 of every ``block`` bytes of ``data``."""
    mv = memoryview(data)
    return [zlib.crc32(mv[i : i + block]) for i in range(start, len(mv), block)]


@dataclass
class FileInfo:
    """One file: its name, size and block checksums (None: unchecked)."""

    name: str
    nbytes: int
    crc32: list[int] | None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.name, "bytes": self.nbytes, "crc32": self.crc32}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "FileInfo":
        return FileInfo(str(d["file"]), int(d["bytes"]), [int(c) for c in d["crc32"]])


# ------------------------------------------------------------ manifests --


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode_manifest(body: dict[str, Any]) -> bytes:
    """The manifest's bytes: ``body`` plus the CRC-32 of its canonical form."""
    out = dict(body, checksum=zlib.crc32(_canonical(body)))
    return json.dumps(out, indent=1, sort_keys=True).encode()


def decode_manifest(
    data: bytes, where: str, fmt: str, version: int, error: ErrorType = DataError
) -> dict[str, Any]:
    """The body of a manifest (``encode_manifest``), checked: its checksum,
    its ``format`` and ``version``."""
    try:
        body = json.loads(data)
        checksum = body.pop("checksum")
        crc = zlib.crc32(_canonical(body))
    except (ValueError, KeyError, AttributeError, TypeError, RecursionError) as e:
        # RecursionError: arrays nested too deep for the parser.
        raise error(f"{where}: manifest is not valid ({type(e).__name__}: {e})") from None
    if crc != checksum:
        raise error(f"{where}: manifest checksum mismatch (the file is corrupted)")
    if body.get("format") != fmt or body.get("version") != version:
        raise error(
            f"{where}: format {body.get('format')!r} version {body.get('version')!r} is not "
            f"{fmt!r} version {version}"
        )
    return body


def _read_whole(path: fs.Location, prefix: str, error: ErrorType) -> bytes:
    """All of ``path``; a missing file is an ``error`` that starts with ``prefix``."""
    try:
        return path.fs.read_bytes(path)
    except FileNotFoundError:
        raise error(f"{prefix}{path} does not exist") from None


def read_manifest(
    folder: str, manifest: str, fmt: str, version: int, error: ErrorType = DataError
) -> dict[str, Any]:
    """The checked body of ``folder``'s manifest file ``manifest``."""
    where = fs.at(folder).join(manifest)
    return decode_manifest(_read_whole(where, "", error), where, fmt, version, error)


def write_manifest(tmp: str, body: dict[str, Any], manifest: str) -> None:
    """Writes the manifest ``manifest`` into ``tmp`` and fsyncs it and the
    folder: the last write before publishing."""
    body = dict(body, created_unix_ns=time.time_ns())
    tmp = fs.at(tmp)
    tmp.fs.write_bytes(tmp.join(manifest), encode_manifest(body))
    fsync_path(tmp)


# --------------------------------------------------------------- files --


def fsync_path(path: str) -> None:
    """fsync of a file or folder by name (nothing in an object store)."""
    path = fs.at(path)
    path.fs.fsync(path)


class CheckedWriter:
    """Writes one file, computing the CRC-32 of every ``block`` bytes.

    ``close`` flushes and fsyncs the file and returns its ``FileInfo``.
    """

    def __init__(self, path: str, block: int) -> None:
        self.path = fs.at(path)
        self.block = block
        self.fs = self.path.fs
        self.f = self.fs.open_write(self.path)
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
        self.fs.commit(self.f)
        return FileInfo(os.path.basename(self.path), self.nbytes, self.crcs)

    def abort(self) -> None:
        self.fs.discard(self.f)


def read_verified(
    folder: str, info: FileInfo, block: int, what: str, out, error: ErrorType = DataError
) -> None:
    """Reads the file ``info`` names into ``out`` (a contiguous tensor of
    exactly its size) and verifies the CRC-32 of every ``block`` bytes
    (``info.crc32`` None: none)."""
    path = fs.at(folder).join(info.name)
    mv = memoryview(out.reshape(-1).view(torch.uint8).numpy())
    if len(mv) != info.nbytes:
        raise error(f"{what}: {path}: {len(mv)} bytes expected, {info.nbytes} recorded")
    try:
        got = path.fs.read_into(path, mv)
    except FileNotFoundError:
        raise error(f"{what}: {path} does not exist") from None
    if got != info.nbytes:
        raise error(
            f"{what}: {path} is truncated: {got} bytes, the meta JSON records {info.nbytes}"
        )
    if info.crc32 is None:
        return
    starts = range(0, info.nbytes, block)
    if len(starts) != len(info.crc32):
        raise error(
            f"{what}: {path}: the meta JSON lists {len(info.crc32)} checksums for "
            f"{len(starts)} blocks"
        )
    for i, lo in enumerate(starts):
        if zlib.crc32(mv[lo : lo + block]) != info.crc32[i]:
            raise error(
                f"{what}: {path} is corrupted: checksum mismatch in block {i} "
                f"(bytes {lo}..{min(lo + block, info.nbytes)})"
            )


def write_small(folder: str, name: str, data: bytes) -> FileInfo:
    """A whole small file (a meta JSON), fsynced; returns its info with a
    single CRC-32 over all of it."""
    full = fs.at(folder).join(name)
    full.fs.write_bytes(full, data)
    return FileInfo(name, len(data), [zlib.crc32(data)])


def read_small(
    folder: str, info: FileInfo | None, name: str, what: str, error: ErrorType = DataError
) -> bytes:
    """A small file ``write_small`` wrote, checked against ``info`` (None:
    unchecked)."""
    full = fs.at(folder).join(name)
    data = _read_whole(full, f"{what}: ", error)
    if info is not None and (len(data) != info.nbytes or [zlib.crc32(data)] != info.crc32):
        raise error(
            f"{what}: {full} is corrupted or truncated ({len(data)} bytes, checksum mismatch "
            f"with the manifest's {info.nbytes} bytes)"
        )
    return data


def check_sizes(
    folder: str, infos: list[FileInfo], what: str, error: ErrorType = DataError
) -> None:
    """Every file exists with the size its meta records (a truncated or
    missing file is reported before anything is read)."""
    folder = fs.at(folder)
    for info in infos:
        full = folder.join(info.name)
        try:
            size = full.fs.size(full)
        except FileNotFoundError:
            raise error(f"{what}: {full} does not exist") from None
        if size != info.nbytes:
            raise error(
                f"{what}: {full} has {size} bytes, the meta JSON records {info.nbytes} "
                f"({'truncated' if size < info.nbytes else 'extended'})"
            )


# ----------------------------------------------------------- publishing --


def new_token() -> str:
    return f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def siblings(path: str, tag: str) -> list[str]:
    """The folders beside ``path`` named ``<path><tag>...`` (``TMP_TAG``,
    ``OLD_TAG``), sorted (none in an object store, which makes none)."""
    path = fs.at(path)
    if not path.fs.renames:
        return []
    parent, base = os.path.split(os.path.abspath(fs.local_path(path)))
    if not os.path.isdir(parent):
        return []
    return [
        path.on(os.path.join(parent, n))
        for n in sorted(os.listdir(parent))
        if n.startswith(base + tag)
    ]


def versions(path: str) -> list[tuple[int, str]]:
    """An object store's versions of folder ``path`` (``make_tmp``),
    committed or not: (number, folder), ascending."""
    path = fs.at(path)
    found = [(_VERSION.match(n), n) for n in path.fs.listdir(path)]
    return sorted((int(m.group(1)), path.join(n)) for m, n in found if m)


def make_tmp(path: str) -> str:
    """A new, empty folder to write what ``publish`` puts at ``path``: beside
    it, or in an object store the next version prefix inside it."""
    path = fs.at(path)
    if not path.fs.renames:
        last = max([n for n, _ in versions(path)] + [0])
        return path.join(f"{VERSION_TAG}{last + 1:08d}")
    local = os.path.abspath(fs.local_path(path))
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = path.on(local + TMP_TAG + new_token())
    os.mkdir(tmp)
    return tmp


def publish(tmp: str, path: str) -> None:
    """Puts the finished folder ``tmp`` at ``path`` (see the module
    docstring). In an object store ``tmp``'s manifest has committed it
    already: everything else in ``path`` is removed."""
    path = fs.at(path)
    store = path.fs
    if not store.renames:
        for name in store.listdir(path):
            other = path.join(name)
            if other != tmp:
                store.rmtree(other)
        return
    path = os.path.abspath(fs.local_path(path))
    parent = fs.Location(os.path.dirname(path), store)
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


def committed(path: str, manifest: str) -> str | None:
    """The folder holding what is published at ``path`` under the manifest
    file name ``manifest``, None: nothing. Locally ``path`` itself when its
    manifest is there; in an object store its highest version holding its
    manifest, else ``path`` itself when it holds the manifest (a folder
    copied there whole)."""
    path = fs.at(path)
    store = path.fs
    if not store.renames:
        for _, folder in reversed(versions(path)):
            if store.isfile(folder.join(manifest)):
                return folder
    return path if store.isfile(path.join(manifest)) else None


def committed_children(folder: str, manifest: str) -> dict[str, str]:
    """The published folders right inside ``folder`` (``committed``): name ->
    the folder holding it, names sorted. In an object store, one listing."""
    folder = fs.at(folder)
    store = folder.fs
    if store.renames:
        out = {}
        for name in store.listdir(folder):
            path = folder.join(name)
            if store.isfile(path.join(manifest)):
                out[name] = path
        return out
    best: dict[str, tuple[int, str]] = {}
    for rel in store.files_below(folder):
        parts = rel.split("/")
        if parts[-1] != manifest or len(parts) not in (2, 3):
            continue
        n = 0
        if len(parts) == 3:
            m = _VERSION.match(parts[1])
            if m is None:
                continue
            n = int(m.group(1))
        if n >= best.get(parts[0], (-1, ""))[0]:
            best[parts[0]] = (n, folder.join(*parts[:-1]))
    return {name: best[name][1] for name in sorted(best)}


# ------------------------------------------------------------- progress --


class Progress:
    """A tqdm bar in bytes for large transfers (``show`` and at least
    ``PROGRESS_MIN_BYTES``); ``update`` is thread-safe enough for a count
    (tqdm locks)."""

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
