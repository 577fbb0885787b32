"""Fused optimizer updates of embedding rows stored with their state.

A row is ``[embedding (dim) | optimizer state]``: the embedding at the
table's dtype (float32, float16 or bfloat16), the state in float32
(``dynamicemb_config.value_row_bytes``; the state's width is
``optimizer_state_dim``). The arithmetic is float32. The update rules are
written once, in ``cc/embedding/optimizer.h``; which optimizers run which
rule, in ``dynamicemb_config.native_optimizer``.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb._checks import as_int, as_real
from dynamicemb.dynamicemb_config import native_optimizer, optimizer_state_dim
from dynamicemb.table import constants, ops

# The updates that read the step (Adam's bias corrections, RMSprop AR's steps
# since a row's last update): a training step hands it to them as data
# (``step_values``).
_READS_STEP = ("ADAM", "ROWWISE_RMSPROP_AR")

# Hyper-parameters that must be integers, and the floor of each that has one.
_INTEGER_FIELDS = ("weight_decay_mode", "row_warmup_steps")
_NON_NEGATIVE = ("learning_rate", "eps", "initial_accumulator_value", "ar_alpha")


@dataclass
class RowOptimizer:
    """An optimizer of ``fused_params`` applied to rows of a value buffer.

    Attributes:
        optimizer (Union[EmbOptimType, DynamicEmbOptimType]): which update.
        learning_rate (float): lr (FTRL's alpha, must be positive).
        eps (float): Adam / Adagrad denominator term.
        beta1, beta2 (float): Adam moments.
        weight_decay (float): decay coefficient.
        weight_decay_mode (int): 0 none, 1 L2 (added to the gradient), 2
            decoupled (rowwise Adagrad); Adam always decays decoupled by
            ``weight_decay``.
        learning_rate_power (float): FTRL's p, <= 0 (-0.5 is the paper's).
        ftrl_beta, l1_reg, l2_reg (float): FTRL's beta, lambda1, lambda2.
        initial_accumulator_value (float): FTRL's n0 (see ``init_state``).
        ar_alpha (float): RMSprop AR's adaptive regularization coefficient: a
            row's weights are scaled by ``max(min_shrinkage, 1 - lr * ar_alpha
            * steps since its last update)`` when it is updated (0: plain
            row-wise RMSprop).
        ema_beta (float): RMSprop AR's EMA decay of mean(g^2), in [0, 1).
        min_shrinkage (float): RMSprop AR's floor of that scale, in [0, 1].
        row_warmup_steps (int): RMSprop AR's warm-up of new rows: a row's
            step size is ``lr * min(1, (n + 1) / row_warmup_steps)`` at its
            n-th update since it was inserted (0: none).

    The FTRL and RMSprop AR hyper-parameters are ignored by the other
    optimizers, as FBGEMM ignores its optimizers' knobs it does not use.
    """

    optimizer: Any
    learning_rate: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    weight_decay_mode: int = 0
    learning_rate_power: float = -0.5
    ftrl_beta: float = 0.0
    l1_reg: float = 0.0
    l2_reg: float = 0.0
    initial_accumulator_value: float = 0.0
    ar_alpha: float = 0.0
    ema_beta: float = 0.99
    min_shrinkage: float = 0.1
    row_warmup_steps: int = 0

    def __post_init__(self) -> None:
        self._native = native_optimizer(self.optimizer)
        self._type = int(constants()["OptimType"][self._native])
        for f in dataclasses.fields(self):
            if f.name == "optimizer":
                continue
            if f.name in _INTEGER_FIELDS:
                as_int(getattr(self, f.name), f.name)
                continue
            lower = 0.0 if f.name in _NON_NEGATIVE else None
            as_real(getattr(self, f.name), f.name, min=lower)
        # OptimField's positions, read here: packed runs inside a training step
        # torch.compile traces, where the extension's constants() cannot be called.
        self._fields = dict(constants()["OptimField"])
        if self._native == "ROWWISE_RMSPROP_AR":
            self._check_rmsprop_ar()
        if self._native == "FTRL":
            if not self.learning_rate > 0:
                raise ValueError(f"FTRL learning_rate must be positive, got {self.learning_rate}")
            if self.learning_rate_power > 0:
                raise ValueError(
                    f"FTRL learning_rate_power must be <= 0, got {self.learning_rate_power}"
                )
            if self.initial_accumulator_value < 0:
                raise ValueError(
                    "FTRL initial_accumulator_value must be >= 0, got "
                    f"{self.initial_accumulator_value}"
                )
        modes = constants()["WeightDecayMode"]
        if int(self.weight_decay_mode) not in modes.values():
            raise ValueError(
                f"weight_decay_mode must be one of {dict(modes)}, got {self.weight_decay_mode}"
            )

    def _check_rmsprop_ar(self) -> None:
        """RMSprop AR's hyper-parameters in their ranges (the op checks them
        again, but a module should refuse them when it is built)."""
        if not 0.0 <= self.ema_beta < 1.0:
            raise ValueError(f"ROWWISE_RMSPROP_AR ema_beta must be in [0, 1), got {self.ema_beta}")
        if not 0.0 <= self.min_shrinkage <= 1.0:
            raise ValueError(
                f"ROWWISE_RMSPROP_AR min_shrinkage must be in [0, 1], got {self.min_shrinkage}"
            )
        if self.row_warmup_steps < 0:
            raise ValueError(
                f"ROWWISE_RMSPROP_AR row_warmup_steps must be >= 0, got {self.row_warmup_steps}"
            )
        if self.weight_decay != 0:
            raise ValueError(
                "ROWWISE_RMSPROP_AR takes no weight_decay (its adaptive regularization is its "
                f"decay), got {self.weight_decay}"
            )

    @property
    def is_adam(self) -> bool:
        return self._native == "ADAM"

    @property
    def reads_step(self) -> bool:
        """Whether the update reads the step (``step_values``)."""
        return self._native in _READS_STEP

    def state_dim(self, dim: int) -> int:
        """Floats of state after an embedding of ``dim``."""
        return optimizer_state_dim(self.optimizer, dim, torch.float32)

    def state_fill(self, state_dim: int) -> tuple[int, float]:
        """The initial state of a row with ``state_dim`` floats of state:
        ``(first, value)``: zeros before index ``first``, ``value`` from it on
        (FTRL's accumulators start at ``initial_accumulator_value``)."""
        if self._native == "FTRL" and self.initial_accumulator_value:
            return state_dim // 2, float(self.initial_accumulator_value)
        return state_dim, 0.0

    def init_state(self, state: torch.Tensor) -> None:
        """Writes the initial state into ``state`` ((rows, state_dim) view of
        new rows), as ``state_fill`` says."""
        first, value = self.state_fill(state.shape[1])
        state.zero_()
        state[:, first:].fill_(value)

    def packed(self, step: int) -> list[float]:
        """The ops' ``optim`` argument: the optimizer type, every
        hyper-parameter and the 1-based ``step``, each at its position in the
        C++ ``OptimField`` (named after this class's fields)."""
        out = [0.0] * len(self._fields)
        for name, pos in self._fields.items():
            if name == "TYPE":
                out[pos] = float(self._type)
            elif name == "STEP":
                out[pos] = float(step)
            else:
                out[pos] = float(getattr(self, name.lower()))
        return out

    def step(
        self, values: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, step: int
    ) -> None:
        """Updates ``values[rows]`` in place with ``grads`` (one reduced gradient
        per distinct row; -1 skips an entry). ``step`` is 1-based."""
        ops().optimizer_step(values, rows, grads, self.packed(step))

    def fused_update(
        self,
        space: tuple[torch.Tensor, torch.Tensor],
        grad_out: torch.Tensor,
        batch: Any,
        step: int,
        element_type: int,
    ) -> None:
        """Reduces each distinct key's gradient from ``grad_out`` (the pooled
        output's gradient) and updates its row in place; ``space`` is the row
        space's two segments, ``batch`` the batch's bag structure
        (cc/embedding/pooling.h: rows are byte offsets into the space),
        ``element_type`` the embeddings' native ElementType. ``step`` is
        1-based; an update that reads it (``reads_step``) takes it from
        ``batch.step_values`` when set. An FP8 row's stochastic rounding
        takes its key and the step from ``batch.rounding`` (its row's offset
        and ``step`` without it)."""
        b = batch
        values = getattr(b, "step_values", None)
        # Only some updates read the step, and from the batch when it has it.
        step = step if self.reads_step and values is None else 1
        ops().embedding_update(
            space[0],
            space[1],
            grad_out,
            b.rows,
            b.occ_offsets,
            b.occ_order,
            b.occ_bag,
            b.weights,
            b.cols,
            b.dims,
            b.batch,
            int(element_type),
            self.packed(step),
            values,
            getattr(b, "rounding", None),
        )
