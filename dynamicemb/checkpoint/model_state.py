"""The dynamic tables' rows in a sharded model's ``state_dict()``.

A sharded collection's state dict holds, next to TorchRec's entries of its
static tables, one entry per dynamic table::

    <prefix><collection>.<table>.dynamicemb_rows      a TableRowsEntry (a dict):
        "meta"    the table's meta JSON (layout.py; world 0, no shards)
        "<v>"     for each virtual shard v this rank writes (dcp.my_shards):
                  its rows, a tuple of (column, tensor) pairs (keys, values,
                  optimizer state when the table keeps one, scores)

so the flow every TorchRec job uses round-trips the rows at any world size::

    dcp.save(model.state_dict(), checkpoint_id=path)           # or {"model": ...}
    state = model.state_dict()
    dcp.load(state, checkpoint_id=path)                        # at any world size
    model.load_state_dict(state)

The virtual shards are DCP's ``DynamicEmbStateful`` ones (dcp.py says why a
hash table is saved as objects in shards whose names do not depend on the
world size): ``state_dict()`` sends every row to the rank writing its shard,
and ``load_state_dict()`` sends each loaded row to the rank owning its key
now and replaces the tables' rows, all of a collection's or none. Both are
collective (every rank calls them, as ``dcp.save`` and ``dcp.load`` do); a
rank calling alone raises naming the call (``Group.meet``). An entry is also
a DCP ``Stateful``: passed at the top level of ``dcp.load`` it loads its table
itself, and a ``model.load_state_dict`` after it does not load it again.

Within ``state_dict_without_rows()`` the state dict leaves the rows out (no
collective: ``torch.save`` of it on one rank, or a job that saves the tables
with ``DynamicEmbDump``) and ``load_state_dict`` does not look for them. A
state dict loaded without rows for a table (written so, or by an older
version) leaves the table as it is and says so once.
"""

import contextlib
import contextvars
import warnings
from typing import Any

from dynamicemb._warnings import warn_once
from dynamicemb.checkpoint.dcp import my_shards, received_rows, virtual_shards
from dynamicemb.checkpoint.dump import check_world, group_of, table_meta
from dynamicemb.checkpoint.layout import TableMeta
from dynamicemb.checkpoint.load import _Plan, apply_all, check_meta
from dynamicemb.io import Group
from dynamicemb.shard.tables import TableRef, model_tables, synchronize

__all__ = ["ENTRY", "MODEL_STATE_ROWS", "TableRowsEntry", "state_dict_without_rows"]

# The last part of a dynamic table's key in a state dict.
ENTRY = "dynamicemb_rows"
META = "meta"

_with_rows = contextvars.ContextVar("dynamicemb_state_dict_rows", default=True)

SAVE_CALL = "state_dict() of a model with dynamic tables"
LOAD_CALL = "load_state_dict() of a model with dynamic tables"


@contextlib.contextmanager
def state_dict_without_rows():
    """Within the block, a sharded model's ``state_dict()`` leaves the dynamic
    tables' rows out (and makes no collective), and ``load_state_dict()``
    neither looks for them nor warns when they are not there."""
    token = _with_rows.set(False)
    try:
        yield
    finally:
        _with_rows.reset(token)


class TableRowsEntry(dict):
    """A dynamic table's entry in a state dict (see the module doc). A
    ``dict`` to DCP, which saves and loads its items; a ``Stateful`` at the top
    level of ``dcp.load``. Pickled (``torch.save``, ``copy.deepcopy``) as a
    plain dict."""

    def __init__(self, items: dict[str, Any], module: Any = None, name: str = "") -> None:
        super().__init__(items)
        self._module, self._name = module, name
        self.loaded = False

    def state_dict(self) -> dict[str, Any]:
        return dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        refs = [r for r in _tables(self._module) if r.name == self._name]
        _load(refs, [state_dict], _group(self._module, LOAD_CALL))
        self.loaded = True

    def __reduce__(self):
        return (dict, (dict(self),))


def _tables(module: Any) -> list[TableRef]:
    """The dynamic tables of one sharded collection, in its order."""
    return [ref for tables in model_tables(module).values() for ref in tables.values()]


def _group(module: Any, call: str) -> Group:
    env = getattr(module, "_env", None)
    group = group_of(getattr(env, "process_group", None), call)
    return group


def _key(module: Any, prefix: str, ref: TableRef) -> str:
    return f"{prefix}{module.STATE_DICT_COLLECTION}.{ref.name}.{ENTRY}"


def _saves_state(ref: TableRef) -> bool:
    return ref.rows.training_state and ref.rows.state_dim(ref.index) > 0


class _ModelStateRows:
    """What the sharded collections call (dynamicemb.shard.embedding)."""

    def save(self, module: Any, destination: dict[str, Any], prefix: str) -> None:
        """Adds the collection's dynamic tables' entries to ``destination``."""
        if not _with_rows.get():
            return
        refs = _tables(module)
        if not refs:
            return
        group = _group(module, SAVE_CALL)
        check_world(refs, group)
        synchronize(refs)
        for ref in refs:
            meta = table_meta(ref, _saves_state(ref), world=0, shards=[])
            items: dict[str, Any] = {META: meta.encode().decode()}
            for v, part in virtual_shards(ref, meta, group).items():
                items[str(v)] = part
            destination[_key(module, prefix, ref)] = TableRowsEntry(items, module, ref.name)

    def load(self, module: Any, state_dict: dict[str, Any], prefix: str) -> None:
        """Takes the collection's entries out of ``state_dict`` and loads the
        rows of those not loaded yet (collective when there are any)."""
        refs = _tables(module)
        entries = [state_dict.pop(_key(module, prefix, ref), None) for ref in refs]
        if not _with_rows.get():
            return
        missing = [ref.name for ref, e in zip(refs, entries) if e is None]
        if missing:
            warn_once(
                f"state_dict_rows_missing:{id(module)}",
                f"load_state_dict: the state dict holds no rows for the dynamic tables {missing} "
                "(it was saved without them, by an older dynamicemb or under "
                "state_dict_without_rows()); their rows are left as they are. Load them with "
                "DynamicEmbLoad or DynamicEmbStateful where they were saved that way.",
                stacklevel=5,
            )
        todo = [
            (ref, e)
            for ref, e in zip(refs, entries)
            if e is not None and not getattr(e, "loaded", False)
        ]
        if todo:
            _load([r for r, _ in todo], [e for _, e in todo], _group(module, LOAD_CALL))


def _load(refs: list[TableRef], entries: list[Any], group: Group) -> None:
    """Loads each table's entry into it: every rank's checks agreed on
    before anything moves, then the rows sent to their owners and put in,
    all tables or none."""
    check_world(refs, group)
    plans, parts, error = [], [], None
    try:
        for ref, entry in zip(refs, entries):
            meta = TableMeta.decode(str(entry[META]).encode(), f"{ref.label}: state dict meta")
            optim = _loads_state(ref, meta)
            plans.append(_Plan(ref, meta, "", check_meta(meta, ref, optim), optim))
            missing = [v for v in my_shards(group) if str(v) not in entry]
            if missing:
                raise KeyError(
                    f"{ref.label}: the state dict's entry lacks the virtual shards {missing} of "
                    f"rank {group.rank} (of {group.world_size}): it holds one rank's share "
                    "of a state dict saved over several; load the DCP checkpoint of every rank"
                )
            parts.append([entry[str(v)] for v in my_shards(group)])
    except BaseException as e:
        error = e
    group.agree(error)
    received = [received_rows(p, part, group) for p, part in zip(plans, parts)]
    apply_all(plans, received, group)


def _loads_state(ref: TableRef, meta: TableMeta) -> bool:
    """Whether the optimizer state of the entry is loaded: when it holds one
    and the table keeps the same optimizer's (else the embeddings and scores
    alone, with a warning)."""
    if not meta.optim_state_dim:
        return False
    rows, t = ref.rows, ref.index
    if (
        _saves_state(ref)
        and meta.optimizer == rows.optimizer_name
        and meta.optim_state_dim in rows.state_widths(t)
    ):
        return True
    warnings.warn(
        f"load_state_dict: {ref.label}: the state dict holds {meta.optimizer}'s optimizer state, "
        f"the table keeps {rows.optimizer_name if _saves_state(ref) else 'none'}; loading the "
        "embeddings and scores alone",
        stacklevel=6,
    )
    return False


MODEL_STATE_ROWS = _ModelStateRows()
