"""Fused optimizer updates of embedding rows stored with their state.

A row is ``[embedding (dim) | optimizer state]``: the embedding at the
table's dtype (float32, float16 or bfloat16), the state in float32
(``dynamicemb_config.value_row_bytes``; the state's width is
``optimizer_state_dim``). The arithmetic is float32. The update rules are
written once, in ``cc/embedding/optimizer.h``.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from dynamicemb._checks import as_int, as_real
from dynamicemb.dynamicemb_config import DynamicEmbOptimType, optimizer_state_dim
from dynamicemb.table import constants, ops

# EmbOptimType (fbgemm) and DynamicEmbOptimType member names -> native OptimType names.
_NATIVE = {
    "SGD": "SGD",
    "EXACT_SGD": "SGD",
    "ADAM": "ADAM",
    "EXACT_ADAGRAD": "EXACT_ADAGRAD",
    "EXACT_ROWWISE_ADAGRAD": "EXACT_ROWWISE_ADAGRAD",
    "FTRL": "FTRL",
}


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

    def __post_init__(self) -> None:
        name = getattr(self.optimizer, "name", None)
        if name not in _NATIVE or (
            name == "FTRL" and not isinstance(self.optimizer, DynamicEmbOptimType)
        ):
            raise ValueError(f"optimizer {self.optimizer!r} has no fused row update")
        self._type = int(constants()["OptimType"][_NATIVE[name]])
        for f in dataclasses.fields(self):
            if f.name == "optimizer":
                continue
            if f.name == "weight_decay_mode":
                as_int(self.weight_decay_mode, "weight_decay_mode")
                continue
            lower = 0.0 if f.name in ("learning_rate", "eps", "initial_accumulator_value") else None
            as_real(getattr(self, f.name), f.name, min=lower)
        # OptimField's positions, read here: packed runs inside a training step
        # torch.compile traces, where the extension's constants() cannot be called.
        self._fields = dict(constants()["OptimField"])
        if isinstance(self.optimizer, DynamicEmbOptimType):
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

    @property
    def is_adam(self) -> bool:
        return _NATIVE[self.optimizer.name] == "ADAM"

    def state_dim(self, dim: int) -> int:
        """Floats of state after an embedding of ``dim``."""
        return optimizer_state_dim(self.optimizer, dim, torch.float32)

    def state_fill(self, state_dim: int) -> tuple[int, float]:
        """The initial state of a row with ``state_dim`` floats of state:
        ``(first, value)``: zeros before index ``first``, ``value`` from it on
        (FTRL's accumulators start at ``initial_accumulator_value``)."""
        if isinstance(self.optimizer, DynamicEmbOptimType) and self.initial_accumulator_value:
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
        1-based; Adam takes its bias corrections from ``batch.adam_bias``
        when set."""
        b = batch
        bias = getattr(b, "adam_bias", None)
        # Only Adam reads the step (its bias corrections), and from the batch
        # when it has them.
        step = step if self.is_adam and bias is None else 1
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
            bias,
        )
