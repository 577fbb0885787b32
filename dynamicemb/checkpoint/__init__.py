"""Checkpoints of dynamic embedding tables.

``DynamicEmbDump`` and ``DynamicEmbLoad`` (the spec's API, also exported by
``dynamicemb``) write and read the folder format of ``layout.py``: crash
safe (a dump publishes a finished folder atomically), checksummed (a
truncated or corrupted file is refused before anything changes), and
reshardable (a checkpoint loads at any world size and ``dist_type``; each key
goes to the rank that owns it now). ``dump`` and ``load`` are the same calls
returning what they wrote and loaded. A sharded model's ``state_dict()``
carries the dynamic tables' rows, written and read here (model_state.py), so
``torch.distributed.checkpoint`` of the model's state dict saves and loads
them at any world size; ``state_dict_without_rows()`` leaves them out.
``DynamicEmbStateful`` puts the dynamic tables into a DCP state of their own
(dcp.py). ``dcp_reader`` is a DCP reader that runs no code from the files
(dcp_reader.py): DCP's own unpickles them. No format of ours is pickled.
``warm_start`` (an addition of ours, beyond the spec) fills dynamic tables
with the rows of a TorchRec collection's state_dict or DCP checkpoint
(warm_start.py). Paths may be fsspec URLs (``s3://...``: dynamicemb.io.fs).

Its names are imported on first use; ``DynamicEmbDump``, ``DynamicEmbLoad``
and the others that reach a model's tables need TorchRec.
"""

import sys
import types

import torch
import torch.distributed as dist

from dynamicemb._seams import first_use
from dynamicemb.checkpoint.layout import CheckpointError

# The public names of the modules below, imported on first use: a reader of
# checkpoints (layout.py, files.py, read.py) needs none of the training side
# (dump, load and warm_start reach a model's tables through the sharders).
_MODULES = {
    "DynamicEmbStateful": "dcp",
    "dcp_reader": "dcp_reader",
    "DumpReport": "dump",
    "dump": "dump",
    "LoadReport": "load",
    "TableLoad": "load",
    "load": "load",
    "state_dict_without_rows": "model_state",
    "WarmStartReport": "warm_start",
    "warm_start": "warm_start",
}


class _Package(types.ModuleType):
    """This package: its ``dcp_reader``, ``dump``, ``load`` and
    ``warm_start`` are the functions of the modules of the same names. The import system binds a
    loaded module to its package's attribute of the module's name, which
    would hide the function; the function is kept."""

    def __setattr__(self, name: str, value) -> None:
        if _MODULES.get(name) == name and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    # By module path: ``from dynamicemb.checkpoint import dump`` would ask
    # this function again. The modules are read from sys.modules below.
    module = _MODULES.get(name)
    if module == "dcp":
        import dynamicemb.checkpoint.dcp
    elif module == "dcp_reader":
        import dynamicemb.checkpoint.dcp_reader
    elif module == "dump":
        import dynamicemb.checkpoint.dump
    elif module == "load":
        import dynamicemb.checkpoint.load
    elif module == "model_state":
        import dynamicemb.checkpoint.model_state
    elif module == "warm_start":
        import dynamicemb.checkpoint.warm_start  # noqa: F401
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return first_use(globals(), name, sys.modules[f"{__name__}.{module}"])


__all__ = [
    "CheckpointError",
    "DumpReport",
    "DynamicEmbDump",
    "DynamicEmbLoad",
    "DynamicEmbStateful",
    "LoadReport",
    "TableLoad",
    "WarmStartReport",
    "dcp_reader",
    "dump",
    "load",
    "state_dict_without_rows",
    "warm_start",
]


def DynamicEmbDump(
    path: str,
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | None = None,
    optim: bool | None = False,
    pg: dist.ProcessGroup | None = None,
) -> None:
    """Dump the dynamic embedding tables of a sharded model to ``path``.

    Every rank writes the rows it holds: per table a key file, a value file
    (at the table's storage dtype), an optimizer-state file when ``optim``
    and a score file (in ``score_strategy`` order), in a folder per
    collection named by its module path (``model.<path>``), plus a meta JSON
    per table and a manifest with every file's checksum. The new checkpoint
    replaces an earlier one at ``path`` atomically: ``path`` always holds the
    earlier or the new one, whatever happens during the dump.

    Args:
        path (str): the checkpoint folder; new, empty, or an earlier
            dynamicemb checkpoint.
        model (torch.nn.Module): a model sharded with the dynamicemb sharders
            (``DistributedModelParallel`` or a module holding the sharded
            collections).
        table_names (Optional[Dict[str, List[str]]]): collection (its name,
            module path or folder) -> dynamic tables to dump. None: all.
        optim (Optional[bool]): also dump the optimizer state. Defaults to False.
        pg (Optional[dist.ProcessGroup]): the sharding's process group.
            Defaults to the default group (none: a single process).

    Raises:
        ValueError: an unknown collection or table in ``table_names``, or
            ``path`` holds something other than a dynamicemb checkpoint.

    Example::

        from dynamicemb import DynamicEmbDump

        # On every rank of the sharding's group (a collective, like dcp.save):
        DynamicEmbDump("/ckpt/step_1000", model, optim=True)
        # The user table of the collection at model.sparse.ebc only:
        DynamicEmbDump("/ckpt/users", model, table_names={"sparse.ebc": ["user"]})
    """
    from dynamicemb.checkpoint.dump import dump

    dump(path, model, table_names, bool(optim), pg)


def DynamicEmbLoad(
    path: str,
    model: torch.nn.Module,
    table_names: dict[str, list[str]] | list[str] | None = None,
    optim: bool = False,
    pg: dist.ProcessGroup | None = None,
) -> None:
    """Load a checkpoint of DynamicEmbDump into the dynamic tables of a model.

    The checkpoint may have been written at any world size and with any
    ``dist_type``: each key goes to the rank that owns it now. Each loaded
    table then holds exactly the checkpoint's keys (its earlier keys are
    removed), with their scores and, with ``optim``, their optimizer state
    (else the optimizer's initial state). A table with less room than the
    checkpoint needs keeps, per bucket, the highest-scored keys, as its
    eviction would; a warning says how many did not fit. Values are read
    at the precision the meta JSON records and converted (with a warning)
    when the table stores another; a differing dim is an error. A
    checkpoint of the legacy layout (no meta JSON) is read as float32 rows
    whose width follows from the file size.

    A load that fails (missing folder or table, wrong dim, truncated or
    corrupted file, ...) raises and leaves the model as it was.

    Args:
        path (str): the checkpoint folder.
        model (torch.nn.Module): the sharded model.
        table_names (Optional[Union[Dict[str, List[str]], List[str]]]):
            collection -> tables, or table names of any collection. None: all
            dynamic tables of the model (each must be in the checkpoint).
        optim (bool): also load the optimizer state (and the step of Adam's
            bias correction). Defaults to False.
        pg (Optional[dist.ProcessGroup]): the sharding's process group.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete or corrupted,
            or lacks a table.
        ValueError: a table's dim, optimizer or score columns differ from
            the checkpoint's.

    Example::

        from dynamicemb import DynamicEmbLoad

        # On every rank, into a model sharded at any world size:
        DynamicEmbLoad("/ckpt/step_1000", model, optim=True)
    """
    from dynamicemb.checkpoint.load import load

    load(path, model, table_names, optim, pg)
