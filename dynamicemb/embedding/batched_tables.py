"""BatchedDynamicEmbeddingTablesV2: many dynamic tables fused, keys in,
pooled (or per-key) embeddings out, fused optimizer updates in backward.

This version composes the table ops (find-or-insert, initializers, row
gathers, fused optimizers) with torch operations; it runs on the CPU and the
GPU alike and is the reference for fused kernels to come.

The step, per batch:
  1. the distinct (table, key) pairs and their counts (segmented_unique);
  2. training: find-or-insert them with the table's score policy; new keys
     get their initializer's row and a fresh optimizer state. Eval: find only;
     absent keys read the eval initializer and nothing is inserted.
     NO_EVICTION tables never evict: before the insert, a table the batch
     could fill (more keys than value rows, or a key map above load 0.5)
     doubles its key map and its value rows; a key whose bucket is full
     doubles its table again and is placed after. Out of memory, a warning
     is given and the keys that do not fit read zeros;
  3. rows of the distinct keys are gathered and pooled (SUM, MEAN, NONE,
     weighted SUM), empty bags give zeros;
  4. backward: per-occurrence gradients are summed per distinct key and the
     optimizer updates the rows in place.
"""

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb._checks import as_int, as_tensor
from dynamicemb.dynamicemb_config import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb.embedding.initializer import init_rows
from dynamicemb.embedding.optimizer import RowOptimizer
from dynamicemb.embedding.score_function import VictimScorer, table_score_columns
from dynamicemb.embedding.unique import segmented_unique
from dynamicemb.table import ScoredHashTable, enums
from dynamicemb.table._native import constants, ops

S = DynamicEmbScoreStrategy

# Rehash attempts of one growth (each doubles the key map once more).
_MAX_REHASH = 16


def _align(n: int, width: int | None) -> int:
    """n rounded up to a multiple of the bucket width (16 for one bucket)."""
    a = width or BUCKET_ALIGNMENT
    return -(-n // a) * a


def _out_of_memory(e: BaseException) -> bool:
    msg = str(e)
    return (
        isinstance(e, torch.OutOfMemoryError)
        or "can't allocate memory" in msg
        or "out of memory" in msg
    )


def _policies(strategies, step: int, custom: int | None, counts: torch.Tensor):
    """Score policies and values of a batch, in the table's internal column
    order: (LFU count, timestamp) for the compound strategy."""
    P = enums.ScorePolicy
    if len(strategies) == 2:  # (TIMESTAMP, LFU) in either order
        vals = torch.stack([counts, torch.zeros_like(counts)], dim=1)
        return [P.ACCUMULATE, P.TIMER], vals
    s = strategies[0]
    if s == S.TIMESTAMP:
        return [P.TIMER], None
    if s == S.STEP:
        return [P.ASSIGN], step
    if s == S.CUSTOMIZED:
        return [P.ASSIGN], custom
    if s == S.LFU:
        return [P.ACCUMULATE], counts.reshape(-1, 1)
    return [P.NONE], None  # NO_EVICTION: the score word holds the row


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
    """One batch's lookup structure (cc/embedding/pooling.h): distinct keys'
    rows, occurrences grouped by distinct key, bags and output layout."""

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


@dataclass
class ExportedRows:
    """Keys of one table with their rows (``export_rows``).

    Attributes:
        keys (torch.Tensor): (n) int64.
        scores (torch.Tensor, optional): (n, num_scores) int64 in
            ``score_strategy`` tuple order; None under NO_EVICTION.
        embeddings (torch.Tensor): (n, dim) at the table's value dtype.
        optimizer_state (torch.Tensor, optional): (n, state_dim); None when
            the rows carry no optimizer state.
    """

    keys: torch.Tensor
    scores: torch.Tensor | None
    embeddings: torch.Tensor
    optimizer_state: torch.Tensor | None


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
        # Compound (TIMESTAMP, LFU) with a score_function: victims ranked by it.
        self._victim_scorer = (
            None
            if self.score_function is None
            else VictimScorer(self.score_function, self.strategies, self.device)
        )
        self.no_eviction = S.NO_EVICTION in self.strategies
        widths = [
            o.bucket_capacity if o.bucket_capacity != MAX_BUCKET_CAPACITY else None
            for o in self.table_options
        ]
        init = [int(o.init_capacity or o.max_capacity) for o in self.table_options]
        if self.no_eviction:
            # The key map holds at most half its slots (a fixed load factor of
            # 0.5); the value buffer holds init_capacity rows. Both double
            # together, without limit, as keys arrive (see _grow).
            caps = [_align(2 * r, w) for r, w in zip(init, widths)]
            self.table = ScoredHashTable(
                caps,
                bucket_capacities=widths,
                num_scores=1,
                no_eviction=True,
                max_capacities=caps,
                row_capacities=init,
                device=self.device,
                validate=False,
            )
        else:
            self.table = ScoredHashTable(
                init,
                bucket_capacities=widths,
                num_scores=self.table_options[0].num_scores(),
                no_eviction=False,
                max_capacities=[int(o.max_capacity) for o in self.table_options],
                max_load_factor=self.table_options[0].max_load_factor,
                device=self.device,
                validate=False,
            )
        self.training_state = all(o.training for o in self.table_options)
        self.width = max(
            d + (self.optimizer.state_dim(d) if self.training_state else 0)
            for d in [self.max_dim] + self.dims
        )
        # Values are indexed by slot; under NO_EVICTION by row: table t's rows
        # are the block [row_base[t], row_base[t] + row_capacity(t)).
        num_rows = self._set_row_bases() if self.no_eviction else self.table.num_slots
        if num_rows * self.width * 4 >= 2**63:
            raise ValueError(
                f"dynamicemb: value rows of {num_rows} rows (init_capacity / max_capacity) x "
                f"{self.width} floats (dim {self.dims} plus optimizer state) exceed what a tensor "
                "can address"
            )
        try:
            self.values = torch.zeros(num_rows, self.width, device=self.device)
        except RuntimeError as e:  # out of memory: the same error, saying what it was for
            raise type(e)(
                f"dynamicemb: cannot allocate {num_rows} value rows (init_capacity / "
                f"max_capacity) of {self.width} floats (dim {self.dims}): {e}"
            ) from e
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
        self._eval_rows = None
        self._init_table_ids = torch.tensor(
            self.initializer_table_ids, dtype=torch.int64, device=self.device
        )
        self._init_groups = {mode: self._group_tables(mode) for mode in (False, True)}
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

    def _set_row_bases(self) -> int:
        """NO_EVICTION: first value row of each table; returns the row total."""
        caps = [self.table.row_capacity(t) for t in range(self.table.num_tables)]
        bases = [0]
        for c in caps:
            bases.append(bases[-1] + c)
        self._row_base_host = bases
        self._row_base = torch.tensor(bases[:-1], dtype=torch.int64, device=self.device)
        return bases[-1]

    def _rows_of(self, slots: torch.Tensor, tids: torch.Tensor) -> torch.Tensor:
        """Value rows of table slots (-1 stays -1)."""
        if not self.no_eviction:
            return slots
        rows = self._row_base[tids] + self.table.rows(slots)
        return torch.where(slots >= 0, rows, slots)

    def _grow(self, tables: Sequence[int], needed: Sequence[int] | None = None) -> bool:
        """NO_EVICTION: doubles the key map and the value rows of ``tables``
        (repeatedly, until ``needed[t]`` keys fit at load 0.5; at least once).
        A key map that cannot place every key at its new capacity is doubled
        again. Out of memory: warns, changes nothing and returns False."""
        caps = [self.table.capacity(t) for t in range(self.table.num_tables)]
        rows = [self.table.row_capacity(t) for t in range(self.table.num_tables)]
        old_rows, old_bases = list(rows), list(self._row_base_host)
        for t in tables:
            want = rows[t] + 1 if needed is None else int(needed[t])
            while want > rows[t] or 2 * want > caps[t]:
                caps[t], rows[t] = caps[t] * 2, rows[t] * 2
        for _ in range(_MAX_REHASH):
            try:
                values = torch.zeros(sum(rows), self.width, device=self.device)
                self.table.relayout(caps, rows)
                break
            except RuntimeError as e:
                if _out_of_memory(e):
                    warnings.warn(
                        f"dynamicemb: NO_EVICTION tables {list(tables)} cannot grow to key map "
                        f"capacities {[caps[t] for t in tables]} and {[rows[t] for t in tables]} "
                        f"rows: out of memory ({e}). Training continues; keys that do not fit "
                        "are not stored and read zeros.",
                        stacklevel=2,
                    )
                    return False
                if "relayout could not place" not in str(e):
                    raise
                # A bucket overflowed at the new capacity: double the key map again.
                for t in tables:
                    caps[t] *= 2
        else:
            raise RuntimeError(
                f"dynamicemb: NO_EVICTION tables {list(tables)} could not be rehashed"
            )
        self._set_row_bases()
        for t in range(self.table.num_tables):
            lo, new_lo = old_bases[t], self._row_base_host[t]
            values[new_lo : new_lo + old_rows[t]] = self.values[lo : lo + old_rows[t]]
        self.values = values
        return True

    def _insert_no_eviction(self, keys, tids):
        """NO_EVICTION find-or-insert: grows the tables the batch could fill
        before inserting, and again for any key whose bucket was full, so that
        every key is stored while memory lasts."""
        n = self.table.num_tables
        incoming = torch.bincount(tids, minlength=n).tolist()
        sizes = self.table.size().tolist()
        needed = [s + i for s, i in zip(sizes, incoming)]
        grow = [
            t
            for t in range(n)
            if needed[t] > self.table.row_capacity(t) or 2 * needed[t] > self.table.capacity(t)
        ]
        if grow:
            self._grow(grow, needed)
        res = self.table.insert(keys, tids)
        slots, status = res.slots, res.status
        for _ in range(_MAX_REHASH):
            failed = status == enums.InsertStatus.FAILED
            if not bool(failed.any()):
                break
            # A full bucket below load 0.5: double the tables it happened in
            # and place the keys again.
            if not self._grow(torch.unique(tids[failed]).tolist()):
                break
            idx = failed.nonzero().squeeze(1)
            again = self.table.insert(keys[idx], tids[idx])
            slots = slots.index_copy(0, idx, again.slots)
            status = status.index_copy(0, idx, again.status)
        return slots, status

    def _move_values(self, old_slots: torch.Tensor, new_slots: torch.Tensor) -> None:
        """After the table's relayout: each key's row follows it to its new slot."""
        fresh = torch.zeros(self.table.num_slots, self.width, device=self.device)
        kept = new_slots >= 0
        fresh[new_slots[kept]] = self.values[old_slots[kept]]
        self.values = fresh

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
        # Every argument is checked before anything changes (table, values,
        # step counter): a refused call leaves the module as it was.
        indices, offsets, frequency_counters, pooling_weights = self._check_inputs(
            indices, offsets, frequency_counters, pooling_weights
        )
        if self.training and S.CUSTOMIZED in self.strategies and self._custom_score is None:
            raise RuntimeError("CUSTOMIZED score strategy: call set_score before the forward pass")
        num_features = len(self.feature_table_map)
        batch = (offsets.numel() - 1) // num_features
        lengths = offsets[1:] - offsets[:-1]
        bag = torch.repeat_interleave(
            torch.arange(lengths.numel(), device=self.device), lengths, output_size=indices.numel()
        )
        feature = bag // max(batch, 1)
        tids = self._feature_tables[feature]
        su = segmented_unique(indices, tids, self.table.num_tables)
        self._uniq_tids = su.table_ids
        counts = su.counts
        if frequency_counters is not None:
            counts = torch.zeros_like(su.counts).index_add_(0, su.inverse, frequency_counters)
        if self.training:
            rows = self._lookup_train(su.keys, su.table_ids, counts)
        else:
            rows = self._lookup_eval(su.keys, su.table_ids)
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
            missing, fill = self._eval_rows
            fill_rows = torch.where(missing, torch.arange(missing.numel(), device=self.device), -1)
            extra = ops().embedding_pool(
                fill,
                fill_rows,
                b.inverse,
                b.bag_offsets,
                b.weights,
                b.cols,
                b.dims,
                b.batch,
                b.out_width,
            )
        return _Lookup.apply(self._placeholder, self, b, extra)

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
        if self.no_eviction:
            slots, status = self._insert_no_eviction(keys, tids)
        else:
            slots, status = self._insert_evicting(keys, tids, counts)
        new = (status == enums.InsertStatus.INSERTED) | (status == enums.InsertStatus.EVICTED)
        rows = self._rows_of(slots, tids)
        if bool(new.any()):
            self._initialize(keys[new], tids[new], rows[new])
        failed = status == enums.InsertStatus.FAILED
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

    def _insert_evicting(self, keys, tids, counts):
        if any(
            self.table.capacity(t) < self.table.max_capacity(t)
            for t in range(self.table.num_tables)
        ):
            # Only tables that can still grow pay for reading the batch's size per table.
            incoming = torch.bincount(tids, minlength=self.table.num_tables).tolist()
            moved = self.table.reserve(incoming)
            if moved is not None:
                self._move_values(*moved)
        policies, vals = _policies(self.strategies, self.step, self._custom_score, counts)
        victim = (
            None if self._victim_scorer is None else self._victim_scorer(self.table, keys, tids)
        )
        res = self.table.insert_and_evict(
            keys, tids, policies=policies, scores=vals, victim_scores=victim
        )
        return res.slots, res.status

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

    def _initialize(self, keys, tids, rows) -> None:
        for sel, d, init in self._init_values(keys, tids, eval_mode=False):
            r = rows if sel is None else rows[sel]
            self.values[r, :d] = init
            if self.training_state:
                # The optimizer state sits right after the table's own dim.
                sd = self.optimizer.state_dim(d)
                state = torch.empty(r.numel(), sd, device=self.device)
                self.optimizer.init_state(state)
                self.values[r, d : d + sd] = state

    def _lookup_eval(self, keys, tids) -> torch.Tensor:
        rows = self._rows_of(self.table.find(keys, tids), tids)
        missing = rows < 0
        self._eval_rows = None
        if bool(missing.any()):
            fill = torch.zeros(keys.numel(), self.max_dim, device=self.device)
            idx = missing.nonzero().squeeze(1)
            for sel, d, init in self._init_values(keys[idx], tids[idx], eval_mode=True):
                fill[idx if sel is None else idx[sel], :d] = init
            self._eval_rows = (missing, fill)
        return rows

    def _pool(self, b: "_Batch") -> torch.Tensor:
        return ops().embedding_pool(
            self.values,
            b.rows,
            b.inverse,
            b.bag_offsets,
            b.weights,
            b.cols,
            b.dims,
            b.batch,
            b.out_width,
        )

    # ----------------------------------------------------------- backward --

    def _apply_gradients(self, grad_out: torch.Tensor, b: "_Batch") -> None:
        """grad_out: the gradient of the forward's output, in its layout."""
        if not self.training_state:
            return
        self.optimizer.fused_update(self.values, grad_out.contiguous(), b, self.step)

    # -------------------------------------------------------- checkpoints --
    # Row access for checkpoints (dynamicemb.checkpoint), one table at a time
    # and in the user's terms: keys, score columns in score_strategy tuple
    # order, embedding and optimizer state of each key. Checkpoints go
    # through these methods only, so where rows live (today one value buffer)
    # can change without the checkpoint code knowing.

    @property
    def value_dtype(self) -> torch.dtype:
        """dtype the rows (embedding and optimizer state) are stored at."""
        return self.values.dtype

    def state_dim(self, table: int) -> int:
        """Optimizer-state elements of one row of ``table`` (0 in eval mode)."""
        return self.optimizer.state_dim(self.dims[table]) if self.training_state else 0

    def checkpoint_score_columns(self) -> list[int] | None:
        """For each score column in ``score_strategy`` tuple order, the table
        score word holding it; None under NO_EVICTION (whose word is a row)."""
        if self.no_eviction:
            return None
        return table_score_columns(self.strategies)

    def export_rows(self, table: int, chunk: int) -> "Iterator[ExportedRows]":
        """The stored keys of ``table`` and their rows, ``chunk`` slots at a
        time, in slot order. Reads each chunk's count (synchronizes)."""
        lo, hi = self.table.slot_range(table)
        cols = self.checkpoint_score_columns()
        dim, sd = self.dims[table], self.state_dim(table)
        for begin in range(lo, hi, chunk):
            ex = self.table.export_batch(begin, min(begin + chunk, hi)).compact()
            rows = self._rows_of(ex.slots, ex.table_ids)  # all valid: the keys are stored
            yield ExportedRows(
                keys=ex.keys,
                scores=None if cols is None else ex.scores[:, cols],
                embeddings=self.values[:, :dim].index_select(0, rows),
                optimizer_state=(
                    self.values[:, dim : dim + sd].index_select(0, rows) if sd else None
                ),
            )

    def clear_tables(self, tables: Sequence[int]) -> None:
        """Erases every key of ``tables`` (their rows become free)."""
        for t in tables:
            lo, hi = self.table.slot_range(t)
            ex = self.table.export_batch(lo, hi).compact()
            if ex.keys.numel():
                self.table.erase(ex.keys, ex.table_ids)

    def reserve_rows(self, table: int, incoming: int) -> None:
        """Grows ``table`` (within its max capacity; NO_EVICTION without
        limit) for ``incoming`` more keys, as a training insert would."""
        n = self.table.num_tables
        if self.no_eviction:
            needed = [int(s) for s in self.table.size().tolist()]
            needed[table] += int(incoming)
            if needed[table] > self.table.row_capacity(table) or 2 * needed[
                table
            ] > self.table.capacity(table):
                self._grow([table], needed)
            return
        counts = [0] * n
        counts[table] = int(incoming)
        moved = self.table.reserve(counts)
        if moved is not None:
            self._move_values(*moved)

    def import_rows(
        self,
        table: int,
        keys: torch.Tensor,
        scores: torch.Tensor | None,
        embeddings: torch.Tensor,
        optimizer_state: torch.Tensor | None,
    ) -> torch.Tensor:
        """Stores keys with their rows in ``table``; a key whose home bucket is
        full fails (nothing is evicted: loaders insert the best keys first).

        Args:
            keys (torch.Tensor): (n) int64.
            scores (torch.Tensor, optional): (n, num_scores) int64 in
                ``score_strategy`` tuple order; None under NO_EVICTION.
            embeddings (torch.Tensor): (n, dim), converted to ``value_dtype``.
            optimizer_state (torch.Tensor, optional): (n, state_dim(table));
                None gives the optimizer's initial state.

        Returns:
            torch.Tensor: (n) bool, the keys stored.
        """
        keys = keys.to(self.device)
        tids = torch.full_like(keys, table)
        if self.no_eviction:
            slots, _ = self._insert_no_eviction(keys, tids)
        else:
            internal = torch.empty_like(scores)
            internal[:, self.checkpoint_score_columns()] = scores
            assign = [enums.ScorePolicy.ASSIGN] * self.table.num_scores
            res = self.table.insert(keys, tids, policies=assign, scores=internal.to(self.device))
            slots = res.slots
        rows = self._rows_of(slots, tids)
        stored = rows >= 0
        every = bool(stored.all())
        r = rows if every else rows[stored]
        dim, sd = self.dims[table], self.state_dim(table)
        emb = embeddings.to(self.device, self.values.dtype)
        self.values[:, :dim].index_copy_(0, r, emb if every else emb[stored])
        if sd:
            if optimizer_state is None:
                state = torch.empty(r.numel(), sd, device=self.device, dtype=self.values.dtype)
                self.optimizer.init_state(state)
            else:
                state = optimizer_state.to(self.device, self.values.dtype)
                state = state if every else state[stored]
            self.values[:, dim : dim + sd].index_copy_(0, r, state)
        return stored

    def checkpoint_snapshot(self) -> dict[str, Any]:
        """A copy of everything a load may change, for ``restore_snapshot``.

        Table state is cloned on its device (a small fraction of the rows);
        the value rows are copied to host memory, and only when some table
        holds keys (rows of an empty module mean nothing)."""
        state = {
            k: v.clone() if isinstance(v, torch.Tensor) else list(v) if isinstance(v, list) else v
            for k, v in self.table._state().items()
        }
        holds_keys = bool((self.table.size() > 0).any())
        return {
            "table": state,
            "max_caps": list(self.table._max_caps),
            "values": self.values.to("cpu", copy=True) if holds_keys else self.values,
            "step": self.step,
            "row_bases": (
                (list(self._row_base_host), self._row_base.clone()) if self.no_eviction else None
            ),
        }

    def restore_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Puts back the state ``checkpoint_snapshot`` copied."""
        self.table._restore(snapshot["table"])
        self.table._max_caps = snapshot["max_caps"]
        self.values = snapshot["values"].to(self.device)
        self.step = snapshot["step"]
        if snapshot["row_bases"] is not None:
            self._row_base_host, self._row_base = snapshot["row_bases"]
