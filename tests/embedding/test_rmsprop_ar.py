"""Row-wise RMSprop with adaptive regularization (ROWWISE_RMSPROP_AR) against
FBGEMM's own CPU kernel of it, and the optimizers a module accepts.

FBGEMM 1.8's ``EmbOptimType`` has no member for the optimizer, but its CPU
backward kernel (``split_embedding_backward_codegen_rowwise_rmsprop_ar_cpu``)
ships: the module's pooled training steps are compared with that kernel
applied to a dense table of the same rows (``ar_alpha`` > 0, rows skipping
steps, so the steps since a row's last update matter). The warm-up of new rows
is dynamicemb's own; the float64 rule (optimizer_reference.py) checks it.
"""

import pytest
import torch

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbOptimType,
    DynamicEmbTableOptions,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

split_configs = pytest.importorskip("fbgemm_gpu.split_embedding_configs")
EmbOptimType = split_configs.EmbOptimType

ROWS, DIM = 64, 8
LR, EPS, AR_ALPHA, EMA_BETA, MIN_SHRINK = 0.3, 1e-8, 0.6, 0.9, 0.2


def _fbgemm_kernel():
    pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
    op = getattr(torch.ops.fbgemm, "split_embedding_backward_codegen_rowwise_rmsprop_ar_cpu", None)
    if op is None:
        pytest.skip("this FBGEMM has no CPU kernel of ROWWISE_RMSPROP_AR")
    return op


def _module(**kw):
    opts = [
        DynamicEmbTableOptions(
            dim=DIM,
            max_capacity=1024,
            bucket_capacity=128,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.5, upper=0.5),
        )
    ]
    args = dict(
        learning_rate=LR, eps=EPS, ar_alpha=AR_ALPHA, ema_beta=EMA_BETA, min_shrinkage=MIN_SHRINK
    )
    args.update(kw)
    return BatchedDynamicEmbeddingTablesV2(
        opts, None, Pool.SUM, DynamicEmbOptimType.ROWWISE_RMSPROP_AR, **args
    )


class _FbgemmTable:
    """One dense FBGEMM table of ROWS rows, with its RMSprop AR state."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.op = _fbgemm_kernel()
        self.weights = weights.clone().reshape(-1)
        self.momentum1 = torch.zeros(ROWS)
        self.prev_iter = torch.zeros(ROWS)

    def step(self, indices, offsets, grad_output, step):
        zi32, zi64 = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
        self.op(
            grad_output,
            self.weights,
            zi32,
            zi64,
            torch.tensor([0, DIM], dtype=torch.int32),
            DIM,
            torch.tensor([0, ROWS]),
            7,
            indices,
            offsets,
            0,  # SUM
            torch.empty(0),
            False,
            self.momentum1,
            zi32,
            zi64,
            self.prev_iter,
            zi32,
            zi64,
            torch.tensor(LR),
            EPS,
            AR_ALPHA,
            step,
            EMA_BETA,
            MIN_SHRINK,
            0,
        )

    def rows(self, keys):
        return self.weights.reshape(ROWS, DIM)[keys]


def _rows_of(module, keys):
    """(embedding, state) of each key, as the module stores them."""
    found = {}
    for chunk in module.rows.export_rows(0, 4096):
        for i, k in enumerate(chunk.keys.tolist()):
            found[k] = (chunk.embeddings[i], chunk.optimizer_state[i])
    emb = torch.stack([found[k][0] for k in keys])
    state = torch.stack([found[k][1] for k in keys])
    return emb, state


def test_module_trains_as_fbgemms_rowwise_rmsprop_ar_kernel():
    m = _module()
    keys = torch.arange(ROWS)
    ref = _FbgemmTable(m.initial_embeddings(keys, torch.zeros(ROWS, dtype=torch.int64))[:, :DIM])
    g = torch.Generator().manual_seed(5)
    touched = set()
    batch = 6
    for step in range(1, 13):
        lengths = torch.randint(0, 4, (batch,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        # A few keys each step: rows skip steps, and repeat within a batch.
        indices = torch.randint(0, ROWS // 4, (int(lengths.sum()),), generator=g)
        out = m(indices, offsets)
        grad = torch.randn(out.shape, generator=g)
        out.backward(grad)
        ref.step(indices, offsets, grad, step)
        touched |= set(indices.tolist())
    seen = sorted(touched)
    emb, state = _rows_of(m, seen)
    torch.testing.assert_close(emb, ref.rows(seen), rtol=1e-5, atol=1e-6)
    # The state FBGEMM keeps in two tensors: the EMA and the last step.
    torch.testing.assert_close(state[:, 0], ref.momentum1[seen], rtol=1e-5, atol=1e-9)
    assert torch.equal(state[:, 1], ref.prev_iter[seen])
    # dynamicemb's third word: the updates each row had (for the warm-up).
    assert state[:, 2].gt(0).all()


def test_warm_up_scales_a_new_rows_first_steps():
    # Two modules, one warming new rows up over 4 updates: a row's first
    # update moves it a quarter as far (ar_alpha's scale aside, which both
    # share), its fourth as far as without warm-up.
    plain, warm = _module(), _module(row_warmup_steps=4)
    key, offsets = torch.tensor([3]), torch.tensor([0, 1])
    moves = []
    for m in (plain, warm):
        start = m.initial_embeddings(key, torch.zeros(1, dtype=torch.int64))[0, :DIM]
        m(key, offsets).sum().backward()
        emb, _ = _rows_of(m, [3])
        moves.append(emb[0] - (1 - LR * AR_ALPHA) * start)
    torch.testing.assert_close(moves[1], moves[0] / 4, rtol=1e-5, atol=1e-7)


def test_bad_hyper_parameters_are_refused_when_the_module_is_built():
    for kw, message in (
        (dict(ema_beta=1.0), "ema_beta must be in \\[0, 1\\), got 1.0"),
        (dict(min_shrinkage=1.5), "min_shrinkage must be in \\[0, 1\\], got 1.5"),
        (dict(row_warmup_steps=-1), "row_warmup_steps must be >= 0, got -1"),
        (dict(row_warmup_steps=1.5), "row_warmup_steps"),
        (dict(ar_alpha=-0.1), "ar_alpha"),
        (dict(weight_decay=0.01), "takes no weight_decay"),
    ):
        with pytest.raises((ValueError, TypeError), match=message):
            _module(**kw)
