"""BatchedDynamicEmbeddingTablesV2: many dynamic tables fused, keys in,
pooled (or per-key) embeddings out, fused optimizer updates in backward.

The module owns what a row means (initializers, optimizer, pooling); where
rows live is its ``TableStorage``'s business (``dynamicemb.storage``: device,
host and hybrid tables, a device cache over a host table or an external
``Storage``), reached only through that interface. It runs on the CPU and the
GPU alike. What it does in a training step, stage by stage, is written once,
in docs/architecture.md ("A training step, top to bottom").
"""

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function

from dynamicemb._checks import as_int
from dynamicemb.dynamicemb_config import (
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb.embedding.admission import ModuleAdmission, create_admitter
from dynamicemb.embedding.cuda_graphs import (
    LookupGraphs,
    PrefetchGraphs,
    graphs_enabled_by_default,
)
from dynamicemb.embedding.initializer import MultiTableInitializer
from dynamicemb.embedding.inputs import check_forward_inputs
from dynamicemb.embedding.insert_failures import InsertFailures
from dynamicemb.embedding.module_warnings import (
    default_optimizer,
    state_dict_hook,
    warn_if_host_only,
)
from dynamicemb.embedding.optimizer import RowOptimizer
from dynamicemb.embedding.refusal import ModuleRefusal
from dynamicemb.embedding.row_init import ModuleRowInit
from dynamicemb.embedding.unique import segmented_unique
from dynamicemb.storage import (
    BatchScore,
    RowLayout,
    TableStorage,
    create_storage,
)
from dynamicemb.storage.score_function import VictimScorer
from dynamicemb.storage.stats import StatCol, TableStats
from dynamicemb.storage.table_rows import TableRows
from dynamicemb.table import ops
from dynamicemb.types import MemoryType

S = DynamicEmbScoreStrategy

# Options every fused table must agree on: one storage serves them all.
_SHARED_STORAGE_OPTIONS = (
    "caching",
    "external_storage",
    "evicted_item_mode",
    "training",
    "refuse_cold_keys",
)


class _Pool(torch.autograd.Function):
    """Pooling forward (embedding_pool), and a backward that
    reduces each distinct key's gradient and updates its row in place
    (embedding_update) -- the optimizer is fused, nothing flows further."""

    @staticmethod
    def forward(ctx, placeholder, module, batch_args):
        ctx.module, ctx.batch_args = module, batch_args
        return batch_args.pool(module.layout.element_type)

    @staticmethod
    def backward(ctx, grad_out):
        ctx.module.apply_gradients(grad_out, ctx.batch_args)
        if not torch.compiler.is_compiling():  # a traced step replays no CUDA graph
            ctx.batch_args.updated = True
        return (None,) * 3


@dataclass
class _Batch:
    """One batch's bag structure (cc/embedding/pooling.h): the row space
    and the distinct keys' rows (byte offsets into it), occurrences grouped by
    distinct key, bags and output layout, and the fill rows of keys stored
    nowhere (a row ``_fill_refs(..)[i]`` reads ``fill[i]``)."""

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
    fill: torch.Tensor | None
    # What the update reads of this step (RowOptimizer.reads_step: Adam's bias
    # corrections, RMSprop AR's step), made in the forward: the iteration
    # reaches the backward as data (an int would be a constant of a backward
    # traced by torch.compile). None for the other optimizers.
    step_values: torch.Tensor | None = None
    # FP8 rows: the distinct keys, and them then the step (embedding_update's rounding).
    keys: torch.Tensor | None = None
    rounding: torch.Tensor | None = None
    # Set once the backward has updated the batch's rows (a batch of a CUDA
    # graph's tensors holds them until then: LookupGraphs).
    updated: bool = False

    def pool(self, element_type: int) -> torch.Tensor:
        """Every bag's (weighted) sum of its rows in the output layout (the
        embedding_pool op), reading the fill rows where ``rows`` refers to
        them."""
        with record_function("dynamicemb:pool"):
            return ops().embedding_pool(
                self.space[0],
                self.space[1],
                self.rows,
                self.inverse,
                self.bag_offsets,
                self.weights,
                self.cols,
                self.dims,
                self.batch,
                self.out_width,
                int(element_type),
                self.fill,
                tiled=True,  # the module's layouts put the features side by side
            )


class BatchedDynamicEmbeddingTablesV2(torch.nn.Module):
    """Fused dynamic embedding tables.

    Args:
        table_options (Sequence[DynamicEmbTableOptions]): one per table; each
            needs ``dim`` and ``max_capacity`` (``init_capacity`` defaults to
            it). The tables share ``score_strategy`` and ``bucket_capacity``
            layout rules of one fused allocation, so NO_EVICTION tables are
            fused only with NO_EVICTION tables. A NO_EVICTION table starts
            with ``init_capacity`` value rows and a key map of
            ``no_eviction_key_slots(init_capacity)`` slots and grows without
            bound (``max_capacity`` and ``max_load_factor`` do not apply). A
            ``score_function`` (compound (TIMESTAMP, LFU) only,
            shared by the fused tables) ranks the victims of full buckets:
            it is compiled with numba when the module is built and evaluated
            over the buckets of each training batch (score_function.py).
            ``admit_strategy``: all tables or none have one, and theirs agree
            on ``get_grouped_key``; the module builds one admitter for them
            (``create_admitter``), ``admitter``, and feeds the ADMISSIONS and
            REJECTIONS columns of its ``stats``; ``refuse_cold_keys``, REFUSALS.
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
        table_names (Sequence[str], optional): the tables' names, for what
            the module says about them (default: ``table_<t>``); the
            sharders pass the TorchRec table names.
        **optimizer_args: the optimizer's hyper-parameters (``learning_rate``,
            ``eps``, ``beta1``, ``beta2``, ``weight_decay``,
            ``weight_decay_mode``, FTRL's ``learning_rate_power``,
            ``ftrl_beta``, ``l1_reg``, ``l2_reg``, ``initial_accumulator_value``).

    Input (TorchRec's TBE convention): ``indices`` (n) int64 and ``offsets``
    (num_features * batch_size + 1), the bags of feature f being
    ``offsets[f * B : (f + 1) * B + 1]``.

    ``cuda_graphs`` (bool, default on unless the environment variable
    ``DYNAMICEMB_CUDA_GRAPHS`` is ``0`` when the module is built): a CUDA
    module replays the training lookup of a batch shape it has seen before
    from a CUDA graph (dynamicemb/embedding/cuda_graphs.py); the results are
    the eager lookup's.
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
        table_names: Sequence[str] | None = None,
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
            optimizer = default_optimizer()
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
        warn_if_host_only(self.table_options, self.device)
        # A state dict has no place for hash-table rows: say so, once.
        self._register_state_dict_hook(state_dict_hook)
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
        # Whether forward reads its inputs' values (offsets, reserved keys,
        # counters and weights) to refuse bad ones: one device-to-host
        # synchronization a step on a GPU. The sharded modules turn it off:
        # TorchRec's input distribution builds their offsets from lengths, and
        # their training step reads nothing from the device.
        self.check_values = True
        # CUSTOMIZED: the score each table's keys get in the next forward passes.
        self._custom_scores: list[int | None] = [None] * n
        self._custom_score_t = torch.zeros(n, dtype=torch.int64, device=self.device)
        names = [f"table_{t}" for t in range(n)] if table_names is None else list(table_names)
        if len(names) != n:
            raise ValueError(f"table_names has {len(names)} entries for {n} tables: {names}")
        self.table_names = [str(x) for x in names]
        # Keys a training insert could not place, per table, and what is said
        # of them (safe_check_mode: dynamicemb/embedding/insert_failures.py).
        self._failures = InsertFailures(
            self.table_names,
            [int(o.max_capacity) for o in self.table_options],
            self.table_options[0].safe_check_mode,
            self.device,
        )
        self.insert_failures = self._failures.counts
        # What the module counts per table (lookups; admission and cache tiers
        # feed their columns), read by dynamicemb.metrics when it collects.
        self.stats = TableStats(n, self.device)
        if self.storage.has_cache:
            self.stats.feed(StatCol.CACHE_HITS, StatCol.CACHE_MISSES)
            self.storage.cache_observer = self._count_cache_lookups
            self._table_ids_to_end = torch.arange(n + 1, device=self.device)
        self._row_init = ModuleRowInit(
            self,
            None  # each table's own id: no per-key lookup of it in a step
            if self.initializer_table_ids == list(range(n))
            else torch.tensor(self.initializer_table_ids, dtype=torch.int64, device=self.device),
            {
                False: MultiTableInitializer([o.initializer_args for o in self.table_options]),
                True: MultiTableInitializer([o.eval_initializer_args for o in self.table_options]),
            },
        )
        # The keys the tables refuse (refuse_cold_keys; refusal.py).
        self.refusal = (
            ModuleRefusal(self, self._row_init) if self.table_options[0].refuse_cold_keys else None
        )
        self.admitter = create_admitter(self.table_options, self.device)
        # The training step's admission stage (dynamicemb/embedding/admission.py).
        self._admission = None
        if self.admitter is not None:
            self.stats.feed(StatCol.ADMISSIONS, StatCol.REJECTIONS)
            self._admission = ModuleAdmission(
                self, self.admitter, self._row_init, self._find_or_insert
            )
        # The tables' rows as checkpoints, replication and metrics reach them.
        self.rows = TableRows(
            self.storage,
            self.layout,
            self.table_options,
            self.strategies,
            self._row_init,
            self,
            self.device,
            self.score_function,
            str(self.optimizer.optimizer.name) if self.training_state else None,
            self.admitter,
            self.stats,
        )
        # The new rows' initializer groups, built here rather than in a
        # (possibly traced) training step.
        self._row_init.initializers[False].groups(self.dims, self.device)
        # Output layout of pooled batches: feature f's dims[f] columns start at
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
        opt = self.optimizer
        self._adam_betas = (
            torch.tensor([opt.beta1, opt.beta2], dtype=torch.float32, device=self.device)
            if opt.is_adam
            else None
        )
        # Autograd needs one input that requires grad to call backward.
        self._placeholder = torch.nn.Parameter(torch.zeros(1, device=self.device))
        # Whether a CUDA module replays the training lookups of batch shapes
        # it has seen from CUDA graphs (dynamicemb/embedding/cuda_graphs.py).
        self.cuda_graphs = graphs_enabled_by_default()
        cuda = self.device.type == "cuda"
        self._graphs = LookupGraphs(self._graph_state, self._lookup) if cuda else None
        self._prefetch_graphs = (
            PrefetchGraphs(self._prefetch_graph_state, self._prefetch_rows) if cuda else None
        )

    # ------------------------------------------------------------ storage --

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes of ``mem_type`` memory the tables' storage holds (every tier;
        a CPU module holds host memory only) and the admitter's state (a
        frequency counter).

        Raises:
            ValueError: ``mem_type`` is not a MemoryType.
        """
        total = self.storage.memory_usage(mem_type)
        state = None if self.admitter is None else self.admitter.state()
        if state is not None:
            total += state.memory_usage(mem_type)
        return total

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
        g = self._prefetch_graphs
        if g is not None and self.cuda_graphs and not torch.compiler.is_compiling():
            if g.prefetch(self, indices, offsets):
                return
        self.storage.prefetch(*self._prefetch_keys(indices, offsets), forward_stream)

    def _prefetch_keys(self, indices, offsets) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct keys of a coming batch and their table ids (padded
        when the storage ``takes_padded_prefetch``)."""
        su = segmented_unique(
            indices,
            self._occurrence_tables(indices, offsets),
            len(self.table_options),
            padded=self.storage.takes_padded_prefetch,
        )
        return su.keys, su.table_ids

    def _prefetch_rows(self, indices, offsets) -> None:
        """A prefetch's kernels, which ``PrefetchGraphs`` captures."""
        self.storage.graphs.prefetch_rows(*self._prefetch_keys(indices, offsets))

    def _prefetch_graph_state(self) -> tuple | None:
        """The storage's ``graphs.prefetch_state``, or None when a prefetch may
        not be captured (``DYNAMICEMB_DEBUG`` checks the unique on the host)."""
        if os.environ.get("DYNAMICEMB_DEBUG"):
            return None
        return self.storage.graphs.prefetch_state()

    def flush(self) -> None:
        """Writes the device cache's rows back to the backing tier (the cache
        keeps them)."""
        self.storage.flush()

    def purge(self) -> None:
        """Writes the device cache back and empties it (nothing is lost)."""
        self.storage.purge()

    def pop_evicted_keys(self, tables: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Per table, the keys the storage's last tier evicted since the last
        call (``evicted_item_mode=RETAIN_KEY``; empty otherwise). With
        ``tables``, only those are popped."""
        return self.storage.pop_evicted_keys(tables)

    def memory_per_table(self, mem_type: MemoryType) -> list[int]:
        """Bytes of ``mem_type`` memory each table holds in its storage's tiers
        (its slots in the hash tables and its value rows: embedding and
        optimizer state) and its share of the admitter's counter."""
        return self.rows.memory_per_table(mem_type)

    # ---------------------------------------------------------- admission --

    def _count_cache_lookups(self, hit: torch.Tensor, miss: torch.Tensor, tids: torch.Tensor):
        """CACHE_HITS / CACHE_MISSES += a batch's distinct keys the cache held
        (``hit``) or not (``miss``; padding is neither), per table (no
        synchronization). The keys come grouped by table: its bounds are
        where each table id starts."""
        bounds = torch.searchsorted(tids, self._table_ids_to_end)
        self.stats.count_segments(StatCol.CACHE_HITS, hit, bounds)
        self.stats.count_segments(StatCol.CACHE_MISSES, miss, bounds)

    def set_score(self, score: int, tables: Sequence[int] | None = None) -> None:
        """CUSTOMIZED: the score (an int64) the keys of ``tables`` (None: all)
        get in the next forward passes. Warns when it is below a table's
        previous score (unless ``DYNAMICEMB_CSTM_SCORE_CHECK=0``)."""
        score = as_int(score, "score")
        if not -(2**63) <= score < 2**63:
            raise ValueError(f"score {score} does not fit int64")
        num_tables = len(self._custom_scores)
        if tables is None:
            tables = range(num_tables)
        else:
            tables = [as_int(t, "tables entry") for t in tables]
            for t in tables:
                if not 0 <= t < num_tables:
                    raise ValueError(f"tables entry {t} is out of range [0, {num_tables})")
        for t in tables:
            old = self._custom_scores[t]
            if (
                old is not None
                and score < old
                and os.environ.get("DYNAMICEMB_CSTM_SCORE_CHECK", "1") != "0"
            ):
                warnings.warn(
                    f"set_score: new score {score} of table {t} is less than the previous {old}",
                    stacklevel=2,
                )
            self._custom_scores[t] = score
            # On the device with a fill: a host copy would synchronize.
            self._custom_score_t[t].fill_(score)

    def get_custom_score(self, table: int) -> int | None:
        """CUSTOMIZED: the score set for ``table`` (None: never set)."""
        return self._custom_scores[table]

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
        if self.trains() and S.CUSTOMIZED in self.strategies:
            unset = [t for t, c in enumerate(self._custom_scores) if c is None]
            if unset:
                raise RuntimeError(
                    f"CUSTOMIZED score strategy: call set_score before the forward pass (tables "
                    f"{unset} have no score)"
                )
        if self.trains():
            self.step += 1
        b = None
        if self._graphs is not None and self.cuda_graphs and not torch.compiler.is_compiling():
            b = self._graphs.lookup(self, indices, offsets, frequency_counters)
        if b is None:
            b = self._lookup(indices, offsets, frequency_counters, self.step)
        if self.trains():
            self._failures.after_step()
        if pooling_weights is not None:
            b.weights = pooling_weights
        if self.trains() and self._adam_betas is not None:
            # One op in eager and traced steps alike: a torch.pow here would
            # be specialized on the step by torch.compile (torch 2.11 guards
            # on exponents 1 and 2) or computed by the compiler's own pow.
            b.step_values = ops().adam_bias(self._adam_betas, self.step)
        elif self.training and self.optimizer.reads_step:
            # The step itself (exact in float32 up to 2**24 steps).
            b.step_values = torch.full((2,), self.step, dtype=torch.float32, device=self.device)
        if self.trains() and self.layout.scaled:
            b.rounding = torch.cat([b.keys, b.keys.new_full((1,), self.step)])
        return _Pool.apply(self._placeholder, self, b)

    def trains(self) -> bool:
        """Whether a forward now is a training step, which inserts missing keys
        (and may evict) and counts a step: in training mode with gradients
        enabled. A forward under ``torch.no_grad()`` or
        ``torch.inference_mode()`` reads as in eval mode, whatever the mode:
        it finds keys, reads the eval initializer's rows for the missing ones,
        and changes nothing."""
        return self.training and torch.is_grad_enabled()

    def _lookup(self, indices, offsets, frequency_counters, step) -> "_Batch":
        """A checked batch's distinct keys found (and, training, inserted
        with their new rows written) and its bag structure: everything of
        the step before the pooling, a function of the inputs and the
        tables' state alone (what ``LookupGraphs`` captures). ``step``: the
        training step's number, an int or (captured) a (1, 1) tensor. The
        batch's weights are MEAN's (1 / bag length) or None."""
        num_features = len(self.feature_table_map)
        batch = (offsets.numel() - 1) // num_features
        sequence = self.pooling_mode == DynamicEmbPoolingMode.NONE
        # Pooling NONE: `bag` is the sequence's bag offsets 0..n instead.
        bag, tids = ops().occurrence_bags(
            offsets, self._feature_tables, indices.numel(), max(batch, 1), sequence
        )
        # Training on a storage that takes padded batches never reads the
        # number of distinct keys on the host (dynamicemb.embedding.unique),
        # with admission too unless its admitter takes exact batches only.
        padded = self.trains() and self._padded()
        with record_function("dynamicemb:unique"):
            su = segmented_unique(indices, tids, len(self.table_options), padded=padded)
        self.stats.count_lookups(su.table_offsets)
        counts = su.counts
        if frequency_counters is not None:
            counts = torch.zeros_like(su.counts).index_add_(0, su.inverse, frequency_counters)
        with record_function("dynamicemb:find_or_insert"):
            if self.trains():
                rows, fill = self._rows_train(su, counts, padded, step)
            else:
                rows, fill = self._rows_eval(su.keys, su.table_ids)
        space = self.storage.space()
        weights = None
        if self.pooling_mode == DynamicEmbPoolingMode.MEAN:
            lengths = offsets[1:] - offsets[:-1]
            inv_len = 1.0 / lengths.clamp(min=1).to(torch.float32)
            weights = inv_len[bag]
        n = indices.numel()
        occ_offsets = su.occ_offsets
        if sequence:
            # Sequence batches (pooling NONE): every occurrence is a bag of its own.
            b = _Batch(
                space,
                rows,
                su.inverse,
                bag,
                weights,
                occ_offsets,
                su.order,
                bag[:n],
                self._none_cols,
                self._none_dims,
                n,
                self.dims[0],
                fill,
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
                fill,
            )
        b.keys = su.keys
        return b

    def _graph_state(self) -> tuple | None:
        """The addresses of the state tensors a training lookup touches (the
        storage's, the admission counter's and the module's counters) and the
        constants it passes, or None when the lookup may not be captured in a
        CUDA graph: outside training, with an admitter that takes exact
        batches, a storage whose ``train_rows`` synchronizes, failures read on
        the host (``safe_check_mode``), or ``DYNAMICEMB_DEBUG`` checks."""
        if not (self.trains() and self._padded()):
            return None
        if os.environ.get("DYNAMICEMB_DEBUG"):  # the unique's offsets checked on the host
            return None
        if self.table_options[0].safe_check_mode != DynamicEmbCheckMode.IGNORE:
            return None
        storage = self.storage.graphs.state()
        if storage is None:
            return None
        own = (self.stats.counts, self.insert_failures, self._custom_score_t)
        admission = () if self._admission is None else self._admission.graph_state()
        return (*storage, *admission, *(x.data_ptr() for x in own))

    def _padded(self) -> bool:
        """Whether a training lookup takes a padded batch (its storage's
        ``takes_padded_batches``, and an admitter, if any, that does too)."""
        if not self.storage.takes_padded_batches:
            return False
        return self._admission is None or self._admission.padded

    def _batch_input(self, indices: torch.Tensor, offsets: torch.Tensor):
        """A batch in TBE layout on the module's device (int64, contiguous),
        checked as forward checks it (_check_inputs)."""
        indices, offsets, _, _ = self._check_inputs(indices, offsets, None, None)
        return indices, offsets

    def _occurrence_tables(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The table of each occurrence of a batch in TBE layout."""
        batch = (offsets.numel() - 1) // len(self.feature_table_map)
        return ops().occurrence_bags(
            offsets, self._feature_tables, indices.numel(), max(batch, 1), False
        )[1]

    def _check_inputs(self, indices, offsets, frequency_counters, pooling_weights):
        """Forward's arguments checked and on the module's device
        (``dynamicemb.embedding.inputs.check_forward_inputs``)."""
        return check_forward_inputs(self, indices, offsets, frequency_counters, pooling_weights)

    def _rows_train(self, su, counts, padded: bool, step):
        """(rows, fill) of the distinct keys ``su`` (a padded batch when
        ``padded``): rows -1 where not stored, fill rows for the keys admission
        rejects (see _Batch); ``counts`` are the LFU increments, ``step``
        the STEP score."""
        if self._admission is not None:
            return self._admission.rows(su, counts, step)
        keys, tids = su.keys, su.table_ids
        if padded:
            rows = self._find_or_insert(keys, tids, counts, step, su.num_unique, su.valid())
        else:
            rows = self._find_or_insert(keys, tids, counts, step)
        if self.refusal is not None:
            return self.refusal.fill(rows, keys, tids)
        return rows, None

    def _find_or_insert(
        self, keys, tids, counts, step, num_keys=None, valid=None, lookup=None
    ) -> torch.Tensor:
        """Training find-or-insert of distinct keys: their rows (-1 where an
        insert failed); new rows are initialized. A padded batch passes the
        number of its distinct keys (on the device) and their mask, ``valid``,
        or with admission the entries to look up, ``lookup``
        (``TableStorage.train_rows``)."""
        custom = None
        if S.CUSTOMIZED in self.strategies:
            custom = self._custom_score_t[tids].reshape(-1, 1)  # each key its table's
        try:
            score = BatchScore(step, custom)
            rows = self.storage.train_rows(
                keys, tids, counts, score, self._row_init, num_keys=num_keys, lookup=lookup
            )
        except BaseException:
            # The storage failed the step and put its rows back (an external
            # storage raising: dynamicemb.storage.cache): the step did not happen.
            self.step -= 1
            raise
        # Rows at -1: an insert failed (REFUSED_ROW, a refusal, is no failure).
        self._failures.count(rows, tids, lookup if lookup is not None else valid)
        if self.refusal is not None:
            self.refusal.count(rows, tids)
        return rows

    def report_insert_failures(self) -> list[int]:
        """Keys a training insert could not place so far, per table (reads
        the device counters: synchronizes); warns about each table whose
        failures were not reported yet (dynamicemb/embedding/insert_failures.py)."""
        return self._failures.report()

    def initial_embeddings(self, keys, tids, eval_mode: bool = False) -> torch.Tensor:
        """(n, max dim) float32: the initializer's (or the eval initializer's)
        row of each key, zeros past its table's dim."""
        return self._row_init.initial(keys, tids, eval_mode)

    def _rows_eval(self, keys, tids):
        """(rows, fill): keys stored nowhere read the eval initializer's rows
        from the fill buffer."""
        rows = self.storage.eval_rows(keys, tids)
        missing = (rows < 0).nonzero().squeeze(1)
        init = self._row_init
        return init.with_fill(rows, missing, keys, tids, init.initializers[True])

    # ----------------------------------------------------------- backward --

    def apply_gradients(self, grad_out: torch.Tensor, b: "_Batch") -> None:
        """The backward of a lookup (its pooling function's): the fused
        optimizer's update of the rows batch ``b`` read, ``grad_out`` the
        gradient of the forward's output in its layout; then the storage's
        ``after_update``."""
        with record_function("dynamicemb:update"):
            if self.training_state:
                self.optimizer.fused_update(
                    b.space, grad_out.contiguous(), b, self.step, self.layout.element_type
                )
            try:
                self.storage.after_update()
            except BaseException:
                # The rows were not written back: the storage put the step's
                # rows back as they were before it, and the step did not happen.
                self.step -= 1
                raise
