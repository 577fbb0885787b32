"""Reading ``torch.distributed.checkpoint`` (DCP) folders without running
code from them.

DCP's own reader unpickles: its ``.metadata`` file with ``pickle.load``, and
every non-tensor entry with ``torch.load(weights_only=False)``, so a crafted
folder runs whatever its pickles call. ``dcp_reader(path)`` is a DCP storage
reader that does not:

* the metadata is read by an unpickler that builds only the classes DCP's
  metadata is made of (``METADATA_GLOBALS``: its dataclasses, ``torch.Size``,
  dtypes, layouts, paths) and refuses any other name;
* a non-tensor entry is first loaded with ``torch.load(weights_only=True)``
  (tensors, containers, strings and numbers only); one that needs anything
  else is refused before DCP's planner unpickles it;
* tensors are read as DCP reads them (``torch.load(weights_only=True)``).

``warm_start`` reads DCP folders with it, and ``dcp.load(state,
storage_reader=dcp_reader(path))`` loads a whole checkpoint with it
(``DynamicEmbStateful`` included). A refusal is a ``CheckpointError`` naming
the file and what it asked for; nothing of the state was changed by then
(DCP writes the state only after reading).
"""

import collections
import inspect
import io
import pathlib
import pickle
from typing import Any

import torch
import torch.serialization as serialization
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from dynamicemb.checkpoint.layout import CheckpointError
from dynamicemb.io import fs

__all__ = ["METADATA_GLOBALS", "dcp_load", "dcp_load_reader", "dcp_reader", "is_safe_reader"]

# The names a DCP .metadata pickle may build, by module (and torch's dtype,
# layout and memory_format constants).
METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": (
        dcp_metadata,
        {
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        },
    ),
    "torch.distributed.checkpoint.filesystem": (dcp_filesystem, {"_StorageInfo"}),
    "torch.serialization": (serialization, {"_get_layout"}),
    "torch": (torch, {"Size"}),
    "pathlib": (pathlib, {"Path", "PosixPath", "PurePosixPath", "PureWindowsPath", "WindowsPath"}),
    "collections": (collections, {"OrderedDict"}),
}
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, f, where: str) -> None:
        super().__init__(f)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        holder, names = METADATA_GLOBALS.get(module, (None, ()))
        if name in names:
            return getattr(holder, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANTS):
            return getattr(torch, name)
        raise CheckpointError(
            f"{self.where}: the DCP metadata asks for {module}.{name}, which a checkpoint's "
            "metadata never needs: refused (it could run code)"
        )


def read_metadata(stream, where: str) -> Metadata:
    """The ``Metadata`` a DCP ``.metadata`` stream holds, built without
    running code from it.

    Raises:
        CheckpointError: the stream asks for any other name, or is not DCP
            metadata.
    """
    try:
        metadata = _MetadataUnpickler(stream, where).load()
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{where}: not DCP metadata ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where}: holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class _CheckedPlanner:
    """A load planner whose ``load_bytes`` first loads the entry with
    ``weights_only=True`` (refusing what that refuses), then hands it on."""

    def __init__(self, planner, where: str) -> None:
        self._planner = planner
        self._where = where

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        data = value.getvalue()
        try:
            torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:
            fqn = read_item.dest_index.fqn
            raise CheckpointError(
                f"{self._where}: the entry {fqn!r} is not plain data (tensors, containers, "
                f"strings, numbers): refused, it could run code ({e})"
            ) from None
        self._planner.load_bytes(read_item, io.BytesIO(data))


class _SafeReading:
    """What ``dcp_reader`` adds to DCP's reader classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = read_metadata(stream, str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan, planner):
        return super().read_data(plan, _CheckedPlanner(planner, str(self.path)))


class SafeFileSystemReader(_SafeReading, FileSystemReader):
    """``FileSystemReader`` that runs no code from the folder."""


def dcp_reader(path: str):
    """A DCP storage reader of ``path`` (a local folder or an fsspec URL)
    that runs no code from it (see the module docstring)::

        dcp.load(state, storage_reader=dcp_reader(path))
    """
    if fs.is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        class SafeFsspecReader(_SafeReading, FsspecReader):
            """``FsspecReader`` that runs no code from the folder."""

        return SafeFsspecReader(path)
    return SafeFileSystemReader(fs.local_path(path))


def dcp_load(state: dict[str, Any], path: str, **kwargs: Any) -> None:
    """``dcp.load(state, storage_reader=dcp_reader(path), **kwargs)``, a
    failure raised as a ``CheckpointError`` naming ``path`` and what failed
    (DCP raises a ``CheckpointException``, a ``BaseException`` naming only
    the ranks).

    Raises:
        CheckpointError: the folder cannot be read into ``state``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=dcp_reader(path), **kwargs)
    except CheckpointException as e:
        raise CheckpointError(f"{path}: {_first_failure(e)}") from None
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None


def _first_failure(e: BaseException) -> str:
    """What the first failing rank of a ``CheckpointException`` raised."""
    failures = getattr(e, "failures", None) or {}
    for rank in sorted(failures):
        inner = getattr(failures[rank], "exception", failures[rank])
        if isinstance(inner, CheckpointError):
            return f"{inner}"
        return f"cannot be read (rank {rank}: {type(inner).__name__}: {inner})"
    return f"cannot be read ({e})"


def is_safe_reader(reader: Any) -> bool:
    """Whether ``reader`` is one of ``dcp_reader``'s."""
    return isinstance(reader, _SafeReading)


def dcp_load_reader() -> tuple[bool, Any]:
    """(whether this call is made within a ``dcp.load``, that load's storage
    reader or None when it cannot be seen).

    DCP asks a ``Stateful`` for its ``state_dict()`` both to save and to
    know what to load, before it reads anything; the frame of
    ``torch.distributed.checkpoint.load`` tells the two apart."""
    from torch.distributed.checkpoint import state_dict_loader

    code = inspect.unwrap(state_dict_loader.load).__code__
    here = inspect.currentframe()
    frame = here.f_back if here is not None else None
    while frame is not None:
        if frame.f_code is code:
            return True, frame.f_locals.get("storage_reader")
        frame = frame.f_back
    return False, None
