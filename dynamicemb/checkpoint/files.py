"""Where a checkpoint is: publishing a finished checkpoint atomically, and
finding the one a load reads.

A dump writes into a sibling folder and publishes it by two renames
(``dynamicemb.io.files``: ``make_tmp``, ``write_manifest``, ``publish``). A
crash between the two renames leaves no ``<path>`` but two complete
siblings; ``resolve`` (what a load reads) then takes the newest complete
one, and the next dump puts it back at ``<path>`` before anything else
(``prepare_target``). So ``<path>`` reads as the previous checkpoint or the
new one, never as a mixture or a torn one.

In an object store (a URL) a dump writes a new version inside ``<path>``
and its manifest commits it (``dynamicemb.io.files.committed``): a load
reads the committed version; versions without a manifest are ignored.
"""

import os
import shutil
from typing import Any

from dynamicemb.checkpoint.layout import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
)
from dynamicemb.io import fs
from dynamicemb.io.files import OLD_TAG, TMP_TAG, VERSION_TAG, committed, fsync_path, siblings
from dynamicemb.io.files import read_manifest as _read_manifest


def read_manifest(folder: str) -> dict[str, Any]:
    """The checked body of the checkpoint manifest in ``folder``."""
    return _read_manifest(folder, MANIFEST, FORMAT_NAME, FORMAT_VERSION, CheckpointError)


def _complete(folder: str) -> dict[str, Any] | None:
    try:
        return read_manifest(folder)
    except (CheckpointError, OSError):
        return None


def resolve(path: str) -> tuple[fs.Location, dict[str, Any] | None]:
    """The folder a load reads for ``path`` and its manifest (None: a legacy
    checkpoint). Reads only; see the module docstring.

    Raises:
        CheckpointError: no checkpoint at ``path``.
    """
    path = fs.at(path)
    if not path.fs.renames:
        folder = committed(path, MANIFEST)
        if folder is None:
            raise CheckpointError(
                f"no dynamicemb checkpoint at {path!r}: no committed version (a folder with "
                f"its {MANIFEST})"
            )
        return folder, read_manifest(folder)
    path = path.on(fs.local_path(path))
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path, read_manifest(path)
    if os.path.isdir(path):
        return path, None  # legacy layout, or not a checkpoint (the load says which)
    candidates = []
    for folder in siblings(path, TMP_TAG) + siblings(path, OLD_TAG):
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
    path = fs.at(path)
    store = path.fs
    if not store.renames:  # an object store: nothing beside it; publish cleans up
        if store.isfile(path):
            raise ValueError(f"cannot dump to {path!r}: it exists and is not a folder")
        others = [n for n in store.listdir(path) if not n.startswith(VERSION_TAG)]
        if others and committed(path, MANIFEST) is None:
            raise ValueError(
                f"cannot dump to {path!r}: it holds objects but no dynamicemb checkpoint "
                f"({MANIFEST}); dump to a new or empty prefix"
            )
        return
    path = path.on(os.path.abspath(fs.local_path(path)))
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
            fsync_path(path.on(os.path.dirname(path)))
    for folder in siblings(path, TMP_TAG) + siblings(path, OLD_TAG):
        shutil.rmtree(folder, ignore_errors=True)
