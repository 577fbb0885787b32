"""``InferenceEmbeddingTable``: a read-only lookup module over dynamic tables'
rows, built from a checkpoint and kept current by a delta stream.

The module holds one immutable ``State`` (state.py): per group of tables of
one dim, a sorted-key index and the rows in one of five formats
(formats.py). A lookup reads ``self._state`` once and computes with that
object only (lookup.py), so it sees one snapshot whole, whatever happens
meanwhile. A checkpoint load or a delta builds the next state aside (the
delta's rows go where no index points yet) and replaces the reference in
one assignment; writers take a lock among themselves, lookups take none.
"""

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from dynamicemb._checks import device_of
from dynamicemb.dynamicemb_config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
)
from dynamicemb.inference.formats import RowFormat, format_of, pooler
from dynamicemb.inference.index import entry_bytes
from dynamicemb.inference.lookup import RandomDefault, lookup
from dynamicemb.inference.sources import (
    Checkpoint,
    TableDelta,
    check_table_delta,
    checked_meta,
    collection_of,
    read_rows,
)
from dynamicemb.inference.state import Group, GroupRows, State
from dynamicemb.replication.delta import DeltaDumpResult, DeltaError
from dynamicemb.replication.follow import StreamReplica
from dynamicemb.types import ReplayStats

__all__ = ["InferenceEmbeddingTable", "InferenceTableConfig"]

_ZEROS = "zeros"
_ID_DTYPES = (torch.int64, torch.int32)


@dataclass(frozen=True)
class InferenceTableConfig:
    """One table of an ``InferenceEmbeddingTable``.

    Attributes:
        name (str): the table's name, as checkpoints and deltas name it.
        dim (int): its embedding dim; 0: the checkpoint's (``from_checkpoint``).
        feature_names (list[str]): the features that look it up; default:
            the table's name.
        collection (Optional[str]): the collection of the table in
            checkpoints and deltas (its folder, ``model.sparse.ebc``); None:
            the only collection that has a table of this name.
        default (str or DynamicEmbInitializerArgs): what an unknown key
            reads: ``"zeros"``, or an initializer (the training table's
            ``eval_initializer_args``): CONSTANT reads its value, the other
            modes the key's row as the training table's initializer makes
            it, a function of the seed, ``initializer_table_id`` and the key.
        initializer_table_id (Optional[int]): the table id of a random
            default; None: the table's position among the module's tables.
            A sharded model's table uses its position among its
            collection's dynamic tables.
    """

    name: str
    dim: int = 0
    feature_names: list[str] | None = None
    collection: str | None = None
    default: str | DynamicEmbInitializerArgs = _ZEROS
    initializer_table_id: int | None = None

    @property
    def features(self) -> list[str]:
        return list(self.feature_names) if self.feature_names is not None else [self.name]


def _check_config(t: int, c: Any) -> None:
    if not isinstance(c, InferenceTableConfig):
        raise TypeError(f"table {t}: expected an InferenceTableConfig, got {type(c).__name__}")
    if not isinstance(c.dim, int) or isinstance(c.dim, bool) or c.dim <= 0:
        raise ValueError(f"table {c.name!r}: dim must be a positive int, got {c.dim!r}")
    if not c.features or not all(isinstance(f, str) for f in c.features):
        raise ValueError(f"table {c.name!r}: feature_names must be a non-empty list of names")
    if c.default != _ZEROS and not isinstance(c.default, DynamicEmbInitializerArgs):
        raise ValueError(
            f"table {c.name!r}: default must be 'zeros' or a DynamicEmbInitializerArgs, got "
            f"{c.default!r}"
        )


class InferenceEmbeddingTable(torch.nn.Module, StreamReplica):
    """Read-only lookups of dynamic tables' rows: pooled (SUM, MEAN, with
    ``per_sample_weights``) or sequence (NONE), from a ``DynamicEmbDump``
    checkpoint and the deltas of a stream, without the training code.

    An id the table does not hold reads its table's default row
    (``InferenceTableConfig.default``); a lookup never inserts. Rows are
    stored as float32, float16, bfloat16, FP8 (``torch.float8_e4m3fn``, a
    scale per row) or row-wise INT8 (``torch.int8``: codes with a float32
    scale and bias per row, FBGEMM's fused 8-bit layout); a lookup returns
    float32. Lookups are safe from any thread while a checkpoint or delta
    is applied in another: each sees the rows before or after, whole.
    ``torch.export`` exports a lookup (the current rows become the
    program's constants) and ``torch.compile(fullgraph=True)`` compiles it,
    on the CPU and on CUDA.

    Args:
        tables (Sequence[InferenceTableConfig]): the tables, each with its
            dim and features.
        pooling (DynamicEmbPoolingMode): SUM (default), MEAN or NONE (one dim
            for every table).
        dtype (torch.dtype or str): how rows are stored: ``torch.float32``
            (default), ``torch.float16``, ``torch.bfloat16``,
            ``torch.float8_e4m3fn`` or ``torch.int8``.
        device (torch.device, optional): where rows live and lookups run.
        seed (int): the seed of random default rows (a sharded model's
            tables use 0).
        spare (float): room for rows that deltas write before the storage
            is compacted, as a fraction of the rows a checkpoint loads.

    Input: a TorchRec ``KeyedJaggedTensor`` (its weights are the
    ``per_sample_weights`` of SUM), or FBGEMM's TBE convention: ``ids`` (n)
    int64 or int32 and ``offsets`` (F B + 1), F the module's features in
    order (``feature_names``), B bags each, with optional
    ``per_sample_weights`` (n) float32 (SUM only).

    Output: pooled, (B, sum of the features' dims) float32, feature by
    feature (a ``KeyedTensor`` for a KJT); sequence, (n, dim) float32 (a
    dict of ``JaggedTensor`` per feature for a KJT).

    Example::

        table = InferenceEmbeddingTable.from_checkpoint(
            "/ckpt/step_1000", dtype=torch.int8, pooling=DynamicEmbPoolingMode.SUM)
        follower = DeltaFollower(table, "/streams/ctr")   # dynamicemb.replication
        follower.poll()                                   # in a thread, now and then
        pooled = table(kjt)                               # KeyedTensor
    """

    def __init__(
        self,
        tables: Sequence[InferenceTableConfig],
        pooling: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
        dtype: torch.dtype | str = torch.float32,
        device: torch.device | str | None = None,
        seed: int = 0,
        spare: float = 0.25,
    ) -> None:
        super().__init__()
        tables = list(tables)
        if not tables:
            raise ValueError("InferenceEmbeddingTable needs at least one table")
        for t, c in enumerate(tables):
            _check_config(t, c)
        names = [(c.collection, c.name) for c in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"InferenceEmbeddingTable: a table is named twice in {names}")
        features = [f for c in tables for f in c.features]
        if len(set(features)) != len(features):
            raise ValueError(f"InferenceEmbeddingTable: a feature is named twice in {features}")
        self.pooling = DynamicEmbPoolingMode(pooling)
        dims = sorted({c.dim for c in tables})
        if self.pooling == DynamicEmbPoolingMode.NONE and len(dims) != 1:
            raise ValueError(f"pooling NONE needs one dim for all tables, got {dims}")
        if not isinstance(spare, (int, float)) or not 0 <= spare <= 16:
            raise ValueError(f"spare must be a fraction in [0, 16], got {spare!r}")
        self.format: RowFormat = format_of(dtype)
        self.device = device_of(device) if device is not None else torch.device("cpu")
        self.tables = tables
        self.seed = int(seed)
        self.spare = float(spare)
        self.feature_names = features
        order = list(dict.fromkeys(c.dim for c in tables))
        self._groups = tuple(
            Group(d, tuple(t for t, c in enumerate(tables) if c.dim == d), self.format)
            for d in order
        )
        self._where = {
            t: (g, group.tables.index(t))
            for g, group in enumerate(self._groups)
            for t in group.tables
        }
        table_of_feature = [t for t, c in enumerate(tables) for _ in c.features]
        self._feature_groups = [self._where[t][0] for t in table_of_feature]
        self._dims = [tables[t].dim for t in table_of_feature]
        self._feature_locals = [
            torch.tensor(
                [self._where[t][1] if self._where[t][0] == g else -1 for t in table_of_feature],
                dtype=torch.int32,
                device=self.device,
            )
            for g in range(len(self._groups))
        ]
        self._randoms, self._defaults = self._default_rows()
        # A lookup's pooling; an exported one runs PyTorch's ops alone (export).
        self._pool = pooler(self.format, self.device)
        self._export_pool = pooler(self.format, self.device, native=False)
        # Writers (checkpoint loads, deltas) one at a time; lookups lock nothing.
        self._lock = threading.Lock()
        self._collections: list[str | None] = [c.collection for c in tables]
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        self._state = State(
            tuple(
                GroupRows.build(
                    g,
                    d,
                    empty,
                    empty,
                    torch.empty(0, g.width, dtype=g.fmt.storage, device=self.device),
                    0.0,
                )
                for g, d in zip(self._groups, self._defaults)
            ),
            ((None, None),) * len(tables),
        )

    # ----------------------------------------------------------- building --

    def _default_rows(self) -> tuple[tuple[RandomDefault, ...], list[torch.Tensor]]:
        """The tables whose defaults are random, and per group its tables'
        default rows, encoded (zeros for a random default: the
        initializer's row is added at lookup)."""
        randoms, rows = [], []
        for g, group in enumerate(self._groups):
            values = torch.zeros(len(group.tables), group.dim, device=self.device)
            for local, t in enumerate(group.tables):
                d = self.tables[t].default
                if d == _ZEROS:
                    continue
                if d.mode == DynamicEmbInitializerMode.CONSTANT:
                    values[local] = float(d.value)
                    continue
                from dynamicemb.embedding.initializer import initializer_op_args
                from dynamicemb.table import ops

                self._init_rows = ops().init_rows
                init_id = self.tables[t].initializer_table_id
                randoms.append(
                    RandomDefault(
                        g, local, initializer_op_args(d), t if init_id is None else init_id
                    )
                )
            rows.append(self.format.encode(values))
        return tuple(randoms), rows

    @classmethod
    def from_checkpoint(
        cls,
        path: str,
        tables: Sequence[InferenceTableConfig | str] | None = None,
        **kwargs: Any,
    ) -> "InferenceEmbeddingTable":
        """A table of the checkpoint ``path`` (a ``DynamicEmbDump`` folder,
        written at any world size; a local path or an fsspec URL) holding
        its rows.

        Args:
            path (str): the checkpoint.
            tables (Optional[Sequence[Union[InferenceTableConfig, str]]]): the
                tables (a config, whose dim 0 takes the checkpoint's, or a
                table's name); None: every table of the checkpoint.
            **kwargs: the constructor's other arguments (pooling, dtype,
                device, seed, spare).

        Raises:
            CheckpointError: no checkpoint at ``path``, or a damaged one.
            ValueError: a table the checkpoint does not have (or has in
                several collections), a dim that differs from the
                checkpoint's, a row the dtype cannot store.
        """
        ckpt = Checkpoint.open(path)
        names = ckpt.tables()
        if tables is None:
            tables = [InferenceTableConfig(t, collection=c) for c, t in names]
        configs = []
        for c in tables:
            if isinstance(c, str):
                c = InferenceTableConfig(c)
            if isinstance(c, InferenceTableConfig):
                coll = collection_of(names, c.name, c.collection, f"the checkpoint at {path}")
                dim = c.dim or ckpt.meta(coll, c.name)[1].embedding_dim
                c = InferenceTableConfig(
                    c.name, dim, c.feature_names, coll, c.default, c.initializer_table_id
                )
            configs.append(c)
        table = cls(configs, **kwargs)
        table.load_checkpoint(ckpt)
        return table

    def load_checkpoint(self, path: str) -> None:
        """Replaces every table's rows with the checkpoint's at ``path``
        (any world size); the tables' stream positions become the
        checkpoint's. A load that fails changes nothing.

        Raises:
            CheckpointError: no checkpoint, a damaged file, a reserved or
                repeated key.
            ValueError: a table the checkpoint lacks, another dim, a row
                the dtype cannot store.
        """
        self._load(Checkpoint.open(path))

    def _load(self, ckpt: Checkpoint) -> None:
        names = ckpt.tables()
        where = f"the checkpoint at {ckpt.path}"
        colls = [collection_of(names, c.name, c.collection, where) for c in self.tables]
        metas = [checked_meta(ckpt, coll, c.name, c.dim) for coll, c in zip(colls, self.tables)]
        groups = []
        for group, defaults in zip(self._groups, self._defaults):
            # Each table's rows encoded straight into the group's storage.
            rows = [metas[t][1].rows for t in group.tables]
            storage = GroupRows.allocate(group, defaults, sum(rows), self.spare)
            at, keys = len(group.tables), []
            for t, n in zip(group.tables, rows):
                folder, meta = metas[t]
                out = storage[at : at + n]
                keys.append(read_rows(ckpt, colls[t], folder, meta, self.format, out))
                at += n
            local = torch.cat([torch.full_like(k, i) for i, k in enumerate(keys)])
            groups.append(GroupRows.indexed(group, storage, torch.cat(keys), local))
        positions = [(meta.delta_source, meta.delta_sequence) for _, meta in metas]
        with self._lock:
            self._collections = colls
            self._swap(State(tuple(groups), tuple(positions)))

    # ------------------------------------------------------------- deltas --

    def apply_delta(
        self, deltas: dict[str, DeltaDumpResult], switch_from: int | None = None
    ) -> dict[str, dict[str, ReplayStats]]:
        """Applies an incremental dump (``{collection: DeltaDumpResult}``, as
        ``incremental_dump`` or ``read_delta`` give it) to the tables it
        names that this module holds: their keys get the delta's rows, its
        erased and evicted keys read their defaults again. A numbered delta
        must follow each table's position (the one after the last applied,
        of the same run; ``switch_from``: the epoch the tables leave for the
        delta's, as a stream's follower plans it). Everything is checked
        before anything changes; lookups meanwhile see the rows before or
        after. Returns per collection and table what was applied.

        Raises:
            DeltaError: a corrupted delta, one of another run, one that does
                not follow, one of a single rank.
            ValueError: a malformed delta, one of another dim, a row the
                dtype cannot store.
        """
        if not isinstance(deltas, dict) or not all(
            isinstance(d, DeltaDumpResult) for d in deltas.values()
        ):
            raise ValueError(
                "apply_delta: deltas must be a dict of collection path -> DeltaDumpResult"
            )
        with self._lock:
            state = self._state
            changes: dict[int, TableDelta] = {}
            for t, c in enumerate(self.tables):
                entry = self._entry(deltas, t)
                if entry is None:
                    continue
                what = f"table {c.name!r} of {entry[0]!r}"
                change = check_table_delta(entry[1], c.dim, state.positions[t], switch_from, what)
                bad = self.format.unstorable(change.rows)
                if bool(bad.any()):
                    key = int(change.keys[bad.nonzero()[0, 0]])
                    raise ValueError(
                        f"{what}: the row of key {key} cannot be stored as {self.format.name}"
                    )
                change.collection = entry[0]
                changes[t] = change
            groups, stats = self._changed(state, changes)
            positions = [
                self._position(state.positions[t], changes.get(t)) for t in range(len(self.tables))
            ]
            self._swap(State(tuple(groups), tuple(positions)))
        return stats

    def _swap(self, state: State) -> None:
        """Makes ``state`` the one lookups read (under the writers' lock). On
        a GPU its tensors are written first: a lookup on another stream
        reads them whole."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self._state = state

    def _entry(self, deltas, t: int) -> tuple[str, dict[str, Any]] | None:
        """(collection, entry) of table t in ``deltas``; None: not there."""
        c = self.tables[t]
        found = []
        for coll, delta in deltas.items():
            if self._collections[t] is not None and coll != self._collections[t]:
                continue
            found += [
                (coll, delta.table(i)) for i, n in enumerate(delta.table_names) if n == c.name
            ]
        if len(found) > 1:
            raise ValueError(
                f"apply_delta: table {c.name!r} is in several collections of the delta "
                f"{sorted(f[0] for f in found)}: name the collection in its InferenceTableConfig"
            )
        return found[0] if found else None

    def _changed(self, state: State, changes: dict[int, TableDelta]):
        """The groups after ``changes``, and what they did per table."""
        groups, stats = list(state.groups), {}
        for g, group in enumerate(self._groups):
            mine = [(i, changes[t]) for i, t in enumerate(group.tables) if t in changes]
            if not mine:
                continue
            device = self.device

            def cat(parts, dtype=torch.int64):
                return torch.cat(parts) if parts else torch.empty(0, dtype=dtype, device=device)

            keys = cat([d.keys.to(device) for _, d in mine])
            local = cat([torch.full((d.keys.numel(),), i, device=device) for i, d in mine])
            removed = cat([d.removed.to(device) for _, d in mine])
            removed_local = cat(
                [torch.full((d.removed.numel(),), i, device=device) for i, d in mine]
            )
            stored = self.format.encode(
                cat([d.rows.to(device) for _, d in mine], torch.float32).reshape(-1, group.dim)
            )
            groups[g] = groups[g].changed(
                group, keys, local, stored, removed, removed_local, self.spare
            )
            for i, d in mine:
                t = group.tables[i]
                _, held = state.groups[g].index.find(
                    d.removed.to(device), self._locals(group, i, d.removed.numel())
                )
                stats.setdefault(d.collection, {})[self.tables[t].name] = ReplayStats(
                    upserted=d.keys.numel(), erased=int(held.sum())
                )
        return groups, stats

    def _locals(self, group: Group, local: int, n: int) -> torch.Tensor | None:
        if len(group.tables) == 1:
            return None
        return torch.full((n,), local, dtype=torch.int32, device=self.device)

    @staticmethod
    def _position(old, change: TableDelta | None):
        """A table's position after ``change`` (as a replay records it)."""
        if change is None or change.meta.get("sequence") is None:
            return old
        meta, (source, _) = change.meta, old
        run = meta.get("run")
        if run is None:
            return source, meta["sequence"]
        epoch = meta.get("epoch", 0)
        same = source is not None and source.get("run") == run and source.get("epoch") == epoch
        lineage = source.get("lineage", []) if same else []
        return {"run": run, "epoch": epoch, "lineage": lineage}, meta["sequence"]

    # ----------------------------------------------------- StreamReplica --

    def stream_position(self) -> tuple[dict[str, Any] | None, int | None]:
        positions = self._state.positions
        found = {repr(p) for p in positions}
        if len(found) != 1:
            raise DeltaError(
                f"the inference table's tables reflect different stream positions {sorted(found)}"
            )
        return positions[0]

    def load_stream_checkpoint(self, path: str) -> None:
        self.load_checkpoint(path)

    def apply_stream_delta(self, deltas, lineage, switch_from):
        stats = self.apply_delta(deltas, switch_from)
        with self._lock:
            state = self._state
            positions = [
                (None if s is None else {**s, "lineage": [list(x) for x in lineage]}, q)
                for s, q in state.positions
            ]
            self._swap(State(state.groups, tuple(positions)))
        return stats

    # ------------------------------------------------------------ lookups --

    def forward(
        self,
        features: KeyedJaggedTensor | torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ):
        """Looks up a batch: a ``KeyedJaggedTensor`` alone, or ``ids``,
        ``offsets`` and optional ``per_sample_weights`` (see the class
        docstring for the layouts).

        Raises:
            ValueError: a KJT without one of the module's features or with
                a stride per key, ``offsets`` not of F B + 1 entries, weights
                with MEAN or NONE.
            TypeError: ids or offsets not int64 or int32, weights not
                floating point.
        """
        if isinstance(features, KeyedJaggedTensor):
            if offsets is not None or per_sample_weights is not None:
                raise ValueError("a KeyedJaggedTensor carries its offsets and weights")
            return self._kjt(features)
        if offsets is None:
            raise ValueError("ids need their offsets (or pass a KeyedJaggedTensor)")
        return self._lookup(self._state, features, offsets, per_sample_weights)

    def _kjt(self, kjt: KeyedJaggedTensor):
        if kjt.variable_stride_per_key():
            raise ValueError("a KeyedJaggedTensor with a stride per key is not supported")
        keys = kjt.keys()
        if keys != self.feature_names:
            missing = [f for f in self.feature_names if f not in keys]
            if missing:
                raise ValueError(f"the KeyedJaggedTensor has no feature {missing} (it has {keys})")
            kjt = kjt.permute([keys.index(f) for f in self.feature_names])
        out = self._lookup(self._state, kjt.values(), kjt.offsets(), kjt.weights_or_none())
        if self.pooling != DynamicEmbPoolingMode.NONE:
            return KeyedTensor(self.feature_names, self._dims, out)
        rows = torch.split(out, kjt.length_per_key())
        lengths = kjt.lengths().view(len(self.feature_names), -1)
        return {
            f: JaggedTensor(r, lengths=lengths[i])
            for i, (f, r) in enumerate(zip(self.feature_names, rows))
        }

    def _lookup(self, state: State, ids, offsets, weights) -> torch.Tensor:
        for name, t in (("ids", ids), ("offsets", offsets)):
            if not isinstance(t, torch.Tensor) or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor, got {_describe(t)}")
            if t.dtype not in _ID_DTYPES:
                raise TypeError(f"{name} must be int64 or int32, got {t.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} are on {t.device}, the table on {self.device}")
        num_features = len(self.feature_names)
        if (offsets.shape[0] - 1) % num_features != 0:
            raise ValueError(
                f"offsets must have F * B + 1 entries for the {num_features} features "
                f"{self.feature_names}, got {offsets.shape[0]}"
            )
        pooled = self.pooling != DynamicEmbPoolingMode.NONE
        if weights is not None:
            if self.pooling != DynamicEmbPoolingMode.SUM:
                raise ValueError(
                    f"per_sample_weights need pooling SUM, the table's is {self.pooling.name}"
                )
            if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
                raise TypeError(
                    f"per_sample_weights must be a floating tensor, got {_describe(weights)}"
                )
            if weights.shape != ids.shape:
                raise ValueError(
                    f"per_sample_weights have shape {tuple(weights.shape)}, the ids "
                    f"{tuple(ids.shape)}"
                )
            weights = weights.to(torch.float32)
        return lookup(
            self._groups,
            state.groups,
            self._feature_locals,
            self._feature_groups,
            self._dims,
            pooled,
            self.pooling == DynamicEmbPoolingMode.MEAN,
            self._export_pool if torch.compiler.is_exporting() else self._pool,
            self._randoms,
            self._init_rows if self._randoms else None,
            self.seed,
            ids.long(),
            offsets.long(),
            weights,
        )

    def rows(self, table: str, keys: torch.Tensor) -> torch.Tensor:
        """(n, dim) float32: the rows ``keys`` of ``table`` read (their
        default rows where the table does not hold them), as stored."""
        t = self._table(table)
        g, local = self._where[t]
        state = self._state
        ids = keys.to(self.device, torch.int64).reshape(-1)
        group = self._groups[g]
        held, found = state.groups[g].index.locate(ids, self._locals(group, local, ids.numel()))
        slots = torch.where(found, held, local)
        out = group.fmt.decode(state.groups[g].storage[slots], group.dim)
        for r in self._randoms:
            if (r.group, r.local) == (g, local):
                init = self._init_rows(
                    ids, torch.full_like(ids, r.init_id), group.dim, *r.op_args, self.seed
                )
                out = torch.where(found[:, None], out, init)
        return out

    def stored_rows(self, table: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, stored): the keys ``table`` holds, ascending, and their rows
        as stored ((n, width) of the format's storage dtype; formats.py
        gives the layout), e.g. to hand them to another runtime."""
        t = self._table(table)
        g, local = self._where[t]
        index = self._state.groups[g].index
        keys, tables, slots = index.entries()
        mine = tables == local
        return keys[mine], self._state.groups[g].storage[slots[mine]]

    def export(
        self,
        ids: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.export.ExportedProgram:
        """``torch.export`` of a lookup of the example batch (``ids``,
        ``offsets``, ``per_sample_weights``), for batches of any number of
        ids and bags (F B + 1 offsets, B from 0). The program holds the
        current rows as constants (later deltas do not reach it), and runs
        PyTorch's ops alone (rows other than float32 and INT8 decoded before
        their pooling) unless a table's default rows are random (the
        extension's initializer)."""
        from torch.export import Dim
        from torch.fx.experimental import _config as fx_config

        ids_dim = Dim("ids")
        bags = Dim("bags")
        shapes = (
            {0: ids_dim},
            {0: len(self.feature_names) * bags + 1},
            None if per_sample_weights is None else {0: ids_dim},
        )
        # Sizes 0 and 1 are not specialized on: a program serves every batch.
        with fx_config.patch(backed_size_oblivious=True):
            return torch.export.export(
                self, (ids, offsets, per_sample_weights), dynamic_shapes=shapes
            )

    def _table(self, name: str) -> int:
        for t, c in enumerate(self.tables):
            if c.name == name:
                return t
        raise ValueError(f"no table {name!r} (the tables are {[c.name for c in self.tables]})")

    def sizes(self) -> dict[str, int]:
        """Keys each table holds, by name."""
        state, out = self._state, {}
        for g, group in enumerate(self._groups):
            index = state.groups[g].index
            if index.tables is None:
                counts = [index.size]
            else:
                counts = torch.bincount(
                    index.tables[: index.size].long(), minlength=len(group.tables)
                ).tolist()
            for local, t in enumerate(group.tables):
                out[self.tables[t].name] = int(counts[local])
        return out

    def memory(self) -> int:
        """Bytes the rows, their storage's spare room and the index take."""
        return sum(rows.nbytes for rows in self._state.groups)

    @staticmethod
    def bytes_per_row(dtype: torch.dtype | str, dim: int, num_tables: int = 1) -> int:
        """Bytes a key of a table of ``dim`` takes in a group of
        ``num_tables`` tables: its stored row and its index entry (without
        the storage's spare room)."""
        return format_of(dtype).row_bytes(dim) + entry_bytes(num_tables)


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dim()}-D {t.dtype} tensor"
    return type(t).__name__
