"""BatchedDynamicEmbeddingTablesV2: many dynamic tables fused, keys in,
pooled (or per-key) embeddings out, fused optimizer updates in backward.

The module owns what a row means (initializers, optimizer, pooling); where
rows live is its ``TableStorage``'s business (``dynamicemb.storage``: device,
host and hybrid tables, a device cache over a host table or an external
``Storage``), reached only through that interface. It runs on the CPU and the
GPU alike.

The step, per batch:
  1. the distinct (table, key) pairs and their counts (segmented_unique);
  2. training: the storage finds or inserts them with the tables' score
     policy (expanding, fetching from and writing back to its tiers as it
     needs), new keys get their initializer's row and a fresh optimizer
     state. Eval: find only; absent keys read the eval initializer and
     nothing is inserted;
  3. the rows of the distinct keys (byte offsets into the storage's row
     space) are pooled (SUM, MEAN, NONE, weighted SUM), empty bags give zeros;
  4. backward: per-occurrence gradients are summed per distinct key and the
     optimizer updates the rows in place; the storage then writes back the
     rows it kept outside its tiers for the batch.
"""

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb._checks import as_int, as_tensor
from dynamicemb.dynamicemb_config import (
    OPTIMIZER_STATE_DTYPE,
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb.embedding.initializer import init_rows
from dynamicemb.embedding.optimizer import RowOptimizer
from dynamicemb.embedding.score_function import VictimScorer, table_score_columns
from dynamicemb.embedding.stats import StatCol, TableStats
from dynamicemb.embedding.unique import segmented_unique
from dynamicemb.storage import (
    BatchScore,
    ExportedRows,
    RowInit,
    RowLayout,
    TableStorage,
    create_storage,
)
from dynamicemb.table._native import constants, ops
from dynamicemb.types import MemoryType

S = DynamicEmbScoreStrategy

# Options every fused table must agree on: one storage serves them all.
_SHARED_STORAGE_OPTIONS = ("caching", "external_storage", "evicted_item_mode", "training")


class _Lookup(torch.autograd.Function):
    """The fused lookup: pooling forward (embedding_pool), and a backward that
    reduces each distinct key's gradient and updates its row in place
    (embedding_update) -- the optimizer is fused, nothing flows further."""

    @staticmethod
    def forward(ctx, placeholder, module, batch_args, extra):
        ctx.module, ctx.batch_args = module, batch_args
        out = module._pool(batch_args)
        if extra is not None:  # eval: initializer rows of keys the table misses
            out = out + extra
        return out

    @staticmethod
    def backward(ctx, grad_out):
        ctx.module._apply_gradients(grad_out, ctx.batch_args)
        return (None,) * 4


@dataclass
class _Batch:
    """One batch's lookup structure (cc/embedding/pooling.h): the row space
    and the distinct keys' rows (byte offsets into it), occurrences grouped by
    distinct key, bags and output layout."""

    space: tuple[torch.Tensor, torch.Tensor]
    rows: torch.Tensor
    inverse: torch.Tensor
    bag_offsets: torch.Tensor
    weights: torch.Tensor | None
    occ_offsets: torch.Tensor
    occ_order: torch.Tensor
    occ_bag: torch.Tensor
    cols: torch.Tensor
    dims: torch.Tensor
    batch: int
    out_width: int


class BatchedDynamicEmbeddingTablesV2(torch.nn.Module):
    """Fused dynamic embedding tables.

    Args:
        table_options (Sequence[DynamicEmbTableOptions]): one per table; each
            needs ``dim`` and ``max_capacity`` (``init_capacity`` defaults to
            it). The tables share ``score_strategy`` and ``bucket_capacity``
            layout rules of one fused allocation, so NO_EVICTION tables are
            fused only with NO_EVICTION tables. A NO_EVICTION table starts
            with ``init_capacity`` value rows and a key map of twice that and
            grows without bound (``max_capacity`` and ``max_load_factor`` do
            not apply). A ``score_function`` (compound (TIMESTAMP, LFU) only,
            shared by the fused tables) ranks the victims of full buckets:
            it is compiled with numba when the module is built and evaluated
            over the buckets of each training batch (score_function.py).
        feature_table_map (List[int], optional): table of each feature
            (default: feature t uses table t).
        pooling_mode (DynamicEmbPoolingMode): SUM, MEAN or NONE.
        optimizer: an FBGEMM ``EmbOptimType`` or ``DynamicEmbOptimType``.
        device (torch.device, optional): where tables and values live.
        seed (int): the initializers' seed.
        initializer_table_ids (Sequence[int], optional): the table id each
            table's initializer uses (a row depends on (seed, table id, key));
            default: table t uses t. Sharders pass ids that do not depend on
            how tables are fused into modules.
        **optimizer_args: the optimizer's hyper-parameters (``learning_rate``,
            ``eps``, ``beta1``, ``beta2``, ``weight_decay``,
            ``weight_decay_mode``, FTRL's ``learning_rate_power``,
            ``ftrl_beta``, ``l1_reg``, ``l2_reg``, ``initial_accumulator_value``).

    Input (TorchRec's TBE convention): ``indices`` (n) int64 and ``offsets``
    (num_features * batch_size + 1), the bags of feature f being
    ``offsets[f * B : (f + 1) * B + 1]``.
    """

    def __init__(
        self,
        table_options: Sequence[DynamicEmbTableOptions],
        feature_table_map: list[int] | None = None,
        pooling_mode: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
        optimizer: Any = None,
        device: torch.device | None = None,
        seed: int = 0,
        initializer_table_ids: Sequence[int] | None = None,
        **optimizer_args: Any,
    ) -> None:
        super().__init__()
        if not table_options:
            raise ValueError("BatchedDynamicEmbeddingTablesV2 needs at least one table")
        self.table_options = list(table_options)
        for t, o in enumerate(self.table_options):
            if not o.dim or not o.max_capacity:
                raise ValueError(
                    f"table {t}: dim and max_capacity must be set, got {o.dim} and {o.max_capacity}"
                )
        strategies = {o.score_strategies() for o in self.table_options}
        if len(strategies) != 1:
            raise ValueError(f"fused tables must share one score_strategy, got {strategies}")
        self.strategies = next(iter(strategies))
        functions = {o.score_function for o in self.table_options}
        if len(functions) != 1:
            raise ValueError(f"fused tables must share one score_function, got {functions}")
        self.score_function = next(iter(functions))
        self.pooling_mode = DynamicEmbPoolingMode(pooling_mode)
        n = len(self.table_options)
        self.feature_table_map = (
            list(range(n)) if feature_table_map is None else list(feature_table_map)
        )
        for f, t in enumerate(self.feature_table_map):
            if not 0 <= t < n:
                raise ValueError(f"feature {f} maps to table {t}, not one of 0..{n - 1}")
        self.dims = [int(o.dim) for o in self.table_options]
        if self.pooling_mode == DynamicEmbPoolingMode.NONE and len(set(self.dims)) != 1:
            raise ValueError(f"pooling NONE needs one dim for all tables, got {self.dims}")
        if optimizer is None:
            from fbgemm_gpu.split_embedding_configs import EmbOptimType

            optimizer = EmbOptimType.EXACT_SGD
        self.optimizer = RowOptimizer(optimizer, **optimizer_args)
        self.max_dim = max(self.dims)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        for name in _SHARED_STORAGE_OPTIONS:
            values = {getattr(o, name) for o in self.table_options}
            if len(values) != 1:
                raise ValueError(f"fused tables must share one {name}, got {values}")
        dtypes = {o.embedding_dtype or torch.float32 for o in self.table_options}
        if len(dtypes) != 1:
            raise ValueError(f"fused tables must share one embedding_dtype, got {dtypes}")
        self.embedding_dtype = next(iter(dtypes))
        self.no_eviction = S.NO_EVICTION in self.strategies
        self.training_state = self.table_options[0].training
        self.layout = RowLayout(
            self.dims,
            self.embedding_dtype,
            self.optimizer.optimizer if self.training_state else None,
            self.training_state,
        )
        # Compound (TIMESTAMP, LFU) with a score_function: victims ranked by it,
        # a scorer per hash table of the storage.
        scorer_factory = None
        if self.score_function is not None:
            fn, strategies, dev = self.score_function, self.strategies, self.device
            VictimScorer(fn, strategies, dev)  # compiled now: a bad function fails here

            def scorer_factory():
                return VictimScorer(fn, strategies, dev)

        self.storage: TableStorage = create_storage(
            self.table_options, self.layout, self.device, scorer_factory
        )
        self.seed = seed
        if initializer_table_ids is None:
            initializer_table_ids = range(n)
        self.initializer_table_ids = [int(i) for i in initializer_table_ids]
        if len(self.initializer_table_ids) != n:
            raise ValueError(
                f"initializer_table_ids has {len(self.initializer_table_ids)} entries for {n} "
                "tables: "
                f"{self.initializer_table_ids}"
            )
        self.step = 0
        self._custom_score: int | None = None
        self.insert_failures = torch.zeros((), dtype=torch.int64, device=self.device)
        # What the module counts per table (lookups; admission and cache tiers
        # feed their columns), read by dynamicemb.metrics when it collects.
        self.stats = TableStats(n, self.device)
        if self.storage.has_cache:
            self.stats.feed(StatCol.CACHE_HITS, StatCol.CACHE_MISSES)
            self.storage.cache_observer = self._count_cache_lookups
        self._eval_rows = None
        self._init_table_ids = torch.tensor(
            self.initializer_table_ids, dtype=torch.int64, device=self.device
        )
        self._init_groups = {mode: self._group_tables(mode) for mode in (False, True)}
        self._row_init = _ModuleRowInit(self)
        # Output layout of pooled lookups: feature f's dims[f] columns start at
        # cols[f], the features side by side (TorchRec's KeyedTensor order).
        fdims = [self.dims[t] for t in self.feature_table_map]
        fcols = [sum(fdims[:f]) for f in range(len(fdims))]
        self._feature_dims = torch.tensor(fdims, dtype=torch.int64, device=self.device)
        self._feature_cols = torch.tensor(fcols, dtype=torch.int64, device=self.device)
        self._out_width = sum(fdims)
        self._none_dims = torch.tensor([self.dims[0]], dtype=torch.int64, device=self.device)
        self._none_cols = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._feature_tables = torch.tensor(
            self.feature_table_map, dtype=torch.int64, device=self.device
        )
        # Autograd needs one input that requires grad to call backward.
        self._placeholder = torch.nn.Parameter(torch.zeros(1, device=self.device))

    # ------------------------------------------------------------ storage --

    @property
    def table(self):
        """The hash table of the storage's last tier (its counters: size,
        inserts, evictions, insert failures); None for an external storage."""
        s = self.storage
        backing = getattr(s, "backing", s)
        return getattr(backing, "table", None)

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes of ``mem_type`` memory the tables' storage holds (every tier;
        a CPU module holds host memory only).

        Raises:
            ValueError: ``mem_type`` is not a MemoryType.
        """
        return self.storage.memory_usage(mem_type)

    def prefetch(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        forward_stream: Any = None,
    ) -> None:
        """Brings the keys of a coming batch that the storage's backing tier
        holds into its device cache (TorchRec's prefetch pipeline calls it
        for batch i + 1 between the forward and the backward of batch i); a
        no-op without a cache. It changes no result: the forward of that
        batch finds or inserts every key itself."""
        indices, offsets = self._batch_input(indices, offsets)
        su = segmented_unique(
            indices, self._occurrence_tables(indices, offsets), len(self.table_options)
        )
        self.storage.prefetch(su.keys, su.table_ids, forward_stream)

    def flush(self) -> None:
        """Writes the device cache's rows back to the backing tier (the cache
        keeps them)."""
        self.storage.flush()

    def purge(self) -> None:
        """Writes the device cache back and empties it (nothing is lost)."""
        self.storage.purge()

    def pop_evicted_keys(self) -> list[torch.Tensor]:
        """Per table, the keys the storage's last tier evicted since the last
        call (``evicted_item_mode=RETAIN_KEY``; empty otherwise)."""
        return self.storage.pop_evicted_keys()

    def memory_per_table(self, mem_type: MemoryType) -> list[int]:
        """Bytes of ``mem_type`` memory each table holds in its storage's tiers:
        its slots in the hash tables and its value rows (embedding and
        optimizer state)."""
        return self.storage.memory_per_table(mem_type)

    def _count_cache_lookups(self, hit: torch.Tensor, tids: torch.Tensor) -> None:
        """CACHE_HITS / CACHE_MISSES += a batch's distinct keys the cache held
        or not, per table (no synchronization)."""
        hits = torch.zeros(len(self.table_options), dtype=torch.int64, device=self.device)
        hits.index_add_(0, tids, hit.to(torch.int64))
        looked = torch.zeros_like(hits).index_add_(0, tids, torch.ones_like(tids))
        self.stats.add(StatCol.CACHE_HITS, hits)
        self.stats.add(StatCol.CACHE_MISSES, looked - hits)

    def set_score(self, score: int) -> None:
        """CUSTOMIZED: the score of the next forward passes (an int64)."""
        score = as_int(score, "score")
        if not -(2**63) <= score < 2**63:
            raise ValueError(f"score {score} does not fit int64")
        if (
            self._custom_score is not None
            and score < self._custom_score
            and os.environ.get("DYNAMICEMB_CSTM_SCORE_CHECK", "1") != "0"
        ):
            warnings.warn(
                f"set_score: new score {score} is less than the previous {self._custom_score}",
                stacklevel=2,
            )
        self._custom_score = score

    # ------------------------------------------------------------ forward --

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        frequency_counters: torch.Tensor | None = None,
        pooling_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Every argument is checked before anything changes (tables, rows,
        # step counter, statistics): a refused call leaves the module as it was.
        indices, offsets, frequency_counters, pooling_weights = self._check_inputs(
            indices, offsets, frequency_counters, pooling_weights
        )
        if self.training and S.CUSTOMIZED in self.strategies and self._custom_score is None:
            raise RuntimeError("CUSTOMIZED score strategy: call set_score before the forward pass")
        num_features = len(self.feature_table_map)
        batch = (offsets.numel() - 1) // num_features
        lengths = offsets[1:] - offsets[:-1]
        bag = self._bags(indices, lengths)
        tids = self._feature_tables[bag // max(batch, 1)]
        su = segmented_unique(indices, tids, len(self.table_options))
        self.stats.count_lookups(su.table_offsets)
        self._uniq_tids = su.table_ids
        counts = su.counts
        if frequency_counters is not None:
            counts = torch.zeros_like(su.counts).index_add_(0, su.inverse, frequency_counters)
        if self.training:
            rows = self._lookup_train(su.keys, su.table_ids, counts)
        else:
            rows = self._lookup_eval(su.keys, su.table_ids)
        space = self.storage.space()
        weights = pooling_weights
        if self.pooling_mode == DynamicEmbPoolingMode.MEAN:
            inv_len = 1.0 / lengths.clamp(min=1).to(torch.float32)
            weights = inv_len[bag]
        n = indices.numel()
        occ_offsets = torch.zeros(su.counts.numel() + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(su.counts, 0, out=occ_offsets[1:])
        if self.pooling_mode == DynamicEmbPoolingMode.NONE:
            # Sequence lookups: every occurrence is a bag of its own.
            b = _Batch(
                space,
                rows,
                su.inverse,
                torch.arange(n + 1, device=self.device),
                weights,
                occ_offsets,
                su.order,
                torch.arange(n, device=self.device),
                self._none_cols,
                self._none_dims,
                n,
                self.dims[0],
            )
        else:
            b = _Batch(
                space,
                rows,
                su.inverse,
                offsets,
                weights,
                occ_offsets,
                su.order,
                bag,
                self._feature_cols,
                self._feature_dims,
                batch,
                self._out_width,
            )
        extra = None
        if not self.training and self._eval_rows is not None:
            # Keys stored nowhere: their eval initializer's float32 rows, pooled
            # from a buffer of one row per distinct key.
            missing, fill = self._eval_rows
            row_bytes = fill.shape[1] * fill.element_size()
            fill_rows = torch.where(
                missing, torch.arange(missing.numel(), device=self.device) * row_bytes, -1
            )
            extra = ops().embedding_pool(
                fill,
                fill.new_empty(0),
                fill_rows,
                b.inverse,
                b.bag_offsets,
                b.weights,
                b.cols,
                b.dims,
                b.batch,
                b.out_width,
                int(constants()["ElementType"]["FLOAT32"]),
            )
        return _Lookup.apply(self._placeholder, self, b, extra)

    def _batch_input(self, indices: torch.Tensor, offsets: torch.Tensor):
        """A batch in TBE layout on the module's device (int64, contiguous),
        checked as forward checks it (_check_inputs)."""
        indices, offsets, _, _ = self._check_inputs(indices, offsets, None, None)
        return indices, offsets

    def _bags(self, indices: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The bag of each occurrence."""
        return torch.repeat_interleave(
            torch.arange(lengths.numel(), device=self.device), lengths, output_size=indices.numel()
        )

    def _occurrence_tables(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The table of each occurrence of a batch in TBE layout."""
        batch = (offsets.numel() - 1) // len(self.feature_table_map)
        bag = self._bags(indices, offsets[1:] - offsets[:-1])
        return self._feature_tables[bag // max(batch, 1)]

    def _check_inputs(self, indices, offsets, frequency_counters, pooling_weights):
        """Checks forward's arguments (types, shapes, devices, then values, with
        one host synchronization) and returns them on the module's device:
        indices and offsets as int64, frequency counters as int64, weights as
        given. Raises naming the argument; nothing has changed yet."""
        ints = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
        as_tensor(indices, "indices", dtypes=ints, dim=1)
        as_tensor(offsets, "offsets", dtypes=ints, dim=1)
        num_features = len(self.feature_table_map)
        if offsets.numel() < 1 or (offsets.numel() - 1) % num_features:
            raise ValueError(
                f"offsets has {offsets.numel()} entries, not num_features ({num_features}) * "
                "batch_size + 1"
            )
        n = indices.numel()
        if pooling_weights is not None:
            as_tensor(pooling_weights, "pooling_weights", dim=1)
            if self.pooling_mode != DynamicEmbPoolingMode.SUM:
                raise ValueError(
                    f"pooling_weights need pooling mode SUM, got {self.pooling_mode.name}"
                )
            if pooling_weights.dtype != torch.float32:
                raise ValueError(f"pooling_weights must be float32, got {pooling_weights.dtype}")
            if pooling_weights.numel() != n:
                raise ValueError(
                    f"pooling_weights has {pooling_weights.numel()} entries for {n} indices"
                )
            if pooling_weights.requires_grad and torch.is_grad_enabled():
                raise ValueError(
                    "pooling_weights must not require grad while grad mode is enabled: no "
                    "gradient is computed for them"
                )
            if frequency_counters is not None:
                raise ValueError("pass either pooling_weights or frequency_counters, not both")
        if frequency_counters is not None:
            as_tensor(
                frequency_counters,
                "frequency_counters",
                dtypes=ints + (torch.float32, torch.float64, torch.float16, torch.bfloat16),
                dim=1,
            )
            if frequency_counters.numel() != n:
                raise ValueError(
                    f"frequency_counters has {frequency_counters.numel()} entries for {n} indices"
                )
        dev = self.device
        indices = indices.to(dev).long().contiguous()
        offsets = offsets.to(dev).long().contiguous()
        weights = None if pooling_weights is None else pooling_weights.to(dev).contiguous()
        freq = None if frequency_counters is None else frequency_counters.to(dev).contiguous()
        # The value checks, each a count of bad entries, read in one synchronization.
        first_valid = int(constants()["FIRST_VALID_KEY"])
        steps = offsets[1:] - offsets[:-1]
        checks = {
            "offsets_start": offsets[:1] != 0,
            "offsets_end": offsets[-1:] != n,
            "offsets_step": steps < 0,
            "indices": indices < first_valid,
        }
        if freq is not None:
            f64 = freq.double()
            checks["frequency_counters"] = ~torch.isfinite(f64) | (f64 < 0) | (f64 != f64.round())
        if weights is not None:
            checks["pooling_weights"] = ~torch.isfinite(weights)
        bad = torch.stack([c.sum() for c in checks.values()]).tolist()
        if any(bad):
            self._raise_bad_input(dict(zip(checks, bad)), checks, indices, offsets, freq, weights)
        if freq is not None:
            freq = freq.long() if freq.is_floating_point() else freq.to(torch.int64)
        return indices, offsets, freq, weights

    @staticmethod
    def _raise_bad_input(bad, checks, indices, offsets, freq, weights) -> None:
        """The error of forward's first failed value check, naming the
        argument, the first bad entry and its position."""
        n = indices.numel()
        if bad["offsets_start"] or bad["offsets_end"]:
            raise ValueError(
                f"offsets must run from 0 to the number of indices ({n}), got "
                f"{int(offsets[0])} to {int(offsets[-1])}"
            )
        if bad["offsets_step"]:
            i = int(checks["offsets_step"].nonzero()[0, 0]) + 1
            raise ValueError(
                f"offsets must not decrease, got {int(offsets[i - 1])} then {int(offsets[i])} at "
                f"index {i}"
            )
        if bad["indices"]:
            i = int(checks["indices"].nonzero()[0, 0])
            raise ValueError(
                f"indices: key {int(indices[i])} at index {i} is reserved (keys below "
                f"{constants()['FIRST_VALID_KEY']} mark slot states)"
            )
        if bad.get("frequency_counters"):
            i = int(checks["frequency_counters"].nonzero()[0, 0])
            raise ValueError(
                "frequency_counters must be finite whole numbers >= 0, got "
                f"{freq[i].item()} at index {i}"
            )
        i = int(checks["pooling_weights"].nonzero()[0, 0])
        raise ValueError(f"pooling_weights must be finite, got {weights[i].item()} at index {i}")

    def _lookup_train(self, keys, tids, counts) -> torch.Tensor:
        self.step += 1
        self._eval_rows = None
        rows = self.storage.train_rows(
            keys, tids, counts, BatchScore(self.step, self._custom_score), self._row_init
        )
        failed = rows < 0
        mode = self.table_options[0].safe_check_mode
        if mode != DynamicEmbCheckMode.IGNORE:
            n_failed = int(failed.sum())
            if n_failed:
                msg = f"{n_failed} keys could not be inserted into the dynamic embedding table"
                if mode == DynamicEmbCheckMode.ERROR:
                    raise RuntimeError(msg)
                warnings.warn(msg + "; their embeddings are zeros", stacklevel=2)
        self.insert_failures += failed.sum()
        return rows

    def _group_tables(self, eval_mode: bool):
        """Tables grouped by (dim, initializer arguments), so that one
        init_rows call serves a group: [(dim, args, tables on the device)]."""
        groups = {}
        for t, o in enumerate(self.table_options):
            args = o.eval_initializer_args if eval_mode else o.initializer_args
            groups.setdefault((self.dims[t], repr(args)), (self.dims[t], args, []))[2].append(t)
        return [(d, args, torch.tensor(ts, device=self.device)) for d, args, ts in groups.values()]

    def _init_values(self, keys, tids, eval_mode: bool):
        """Yields (selection or None for all, dim, initial rows) per group of
        tables sharing dim and initializer arguments."""
        init_ids = self._init_table_ids[tids]
        groups = self._init_groups[eval_mode]
        for dim, args, tables in groups:
            if len(groups) == 1:
                yield None, dim, init_rows(keys, dim, args, init_ids, self.seed)
                continue
            sel = torch.isin(tids, tables)
            if bool(sel.any()):
                yield sel, dim, init_rows(keys[sel], dim, args, init_ids[sel], self.seed)

    def initial_embeddings(self, keys, tids, eval_mode: bool = False) -> torch.Tensor:
        """(n, max dim) float32: the initializer's (or the eval initializer's)
        row of each key, zeros past its table's dim."""
        out = torch.zeros(keys.numel(), self.max_dim, device=self.device)
        for sel, d, init in self._init_values(keys, tids, eval_mode):
            if sel is None:
                out[:, :d] = init
            else:
                out[sel, :d] = init
        return out

    def _lookup_eval(self, keys, tids) -> torch.Tensor:
        rows = self.storage.eval_rows(keys, tids)
        missing = rows < 0
        self._eval_rows = None
        if bool(missing.any()):
            fill = torch.zeros(keys.numel(), self.max_dim, device=self.device)
            idx = missing.nonzero().squeeze(1)
            fill[idx] = self.initial_embeddings(keys[idx], tids[idx], eval_mode=True)
            self._eval_rows = (missing, fill)
        return rows

    def _pool(self, b: "_Batch") -> torch.Tensor:
        return ops().embedding_pool(
            b.space[0],
            b.space[1],
            b.rows,
            b.inverse,
            b.bag_offsets,
            b.weights,
            b.cols,
            b.dims,
            b.batch,
            b.out_width,
            self.layout.element_type,
        )

    # ----------------------------------------------------------- backward --

    def _apply_gradients(self, grad_out: torch.Tensor, b: "_Batch") -> None:
        """grad_out: the gradient of the forward's output, in its layout."""
        if self.training_state:
            self.optimizer.fused_update(
                b.space, grad_out.contiguous(), b, self.step, self.layout.element_type
            )
        self.storage.after_update()

    # -------------------------------------------------------- checkpoints --
    # Row access for checkpoints, one table at a time and in the user's
    # terms: keys, score columns in score_strategy tuple order, embedding (at
    # embedding_dtype) and optimizer state (float32) of each key, over every
    # tier of the storage.

    @property
    def value_dtype(self) -> torch.dtype:
        """dtype the embeddings are stored at (the optimizer state is float32)."""
        return self.embedding_dtype

    @property
    def optim_state_dtype(self) -> torch.dtype:
        """dtype the optimizer state is stored (and checkpointed) at: float32."""
        return OPTIMIZER_STATE_DTYPE

    def state_dim(self, table: int) -> int:
        """Optimizer-state elements of one row of ``table`` (0 in eval mode)."""
        return self.layout.state_dims[table]

    def checkpoint_score_columns(self) -> list[int] | None:
        """For each score column in ``score_strategy`` tuple order, the table
        score word holding it; None under NO_EVICTION (whose word is a row)."""
        return None if self.no_eviction else table_score_columns(self.strategies)

    def export_rows(self, table: int, chunk: int) -> Iterator[ExportedRows]:
        """The stored keys of ``table`` and their rows, ``chunk`` keys or fewer
        at a time. Reads each chunk's count (synchronizes)."""
        return self.storage.export_rows(table, chunk)

    def import_rows(
        self,
        table: int,
        keys: torch.Tensor,
        scores: torch.Tensor | None,
        embeddings: torch.Tensor,
        optimizer_state: torch.Tensor | None,
    ) -> torch.Tensor:
        """Stores keys with their rows in ``table`` (``optimizer_state`` None
        gives the optimizer's initial state); a key whose home bucket is full
        fails. Returns (n) bool, the keys stored."""
        return self.storage.import_rows(
            table, keys, scores, embeddings, optimizer_state, self._row_init
        )

    def clear_tables(self, tables: Sequence[int]) -> None:
        """Erases every key of ``tables`` from every tier."""
        self.storage.clear_tables(tables)

    def reserve_rows(self, table: int, incoming: int) -> None:
        """Expands ``table`` for ``incoming`` more keys, as a training insert would."""
        self.storage.reserve_rows(table, incoming)

    def checkpoint_snapshot(self) -> dict[str, Any]:
        """A copy of everything a load may change, for ``restore_snapshot``
        (the storage's tables and rows, rows in host memory; the step)."""
        return {"storage": self.storage.snapshot(), "step": self.step}

    def restore_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Puts back the state ``checkpoint_snapshot`` copied."""
        self.storage.restore(snapshot["storage"])
        self.step = snapshot["step"]


class _ModuleRowInit(RowInit):
    """A module's new rows: its initializers' embeddings, its optimizer's
    initial state."""

    def __init__(self, module: BatchedDynamicEmbeddingTablesV2) -> None:
        self.module = module

    def embeddings(self, keys: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        return self.module.initial_embeddings(keys, tids)

    def init_state(self, state: torch.Tensor) -> None:
        self.module.optimizer.init_state(state)
