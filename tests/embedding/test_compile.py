"""BatchedDynamicEmbeddingTablesV2's training step under
``torch.compile(fullgraph=True)``: forward (segmented unique, find-or-insert,
new rows, pooling) and backward (the fused update) trace into one graph
without a break, through the ops' fake (Meta) kernels, train exactly like the
eager module, and are not traced again step after step.

Two dynamo settings the module needs: ``allow_unspec_int_on_nn_module`` (the
module's step counter is an int attribute that changes every step: without
it every step would compile anew), and on the CPU ``capture_scalar_outputs``
(the CPU storage reads the number of distinct keys, on the host; a CUDA step
reads nothing).
"""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbOptimType,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from tests.embedding.tbe_batches import random_batches, unchecked_module

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType

OPTIMIZERS = {
    "sgd": (EmbOptimType.EXACT_SGD, {}),
    "adam": (EmbOptimType.ADAM, {}),
    "ftrl": (DynamicEmbOptimType.FTRL, {"initial_accumulator_value": 0.1}),
    "rmsprop_ar": (
        DynamicEmbOptimType.ROWWISE_RMSPROP_AR,
        {"ar_alpha": 0.5, "row_warmup_steps": 2},
    ),
}


def _module(device, optimizer, pooling, strategy):
    opt, kw = OPTIMIZERS[optimizer]
    opts = [
        DynamicEmbTableOptions(
            dim=d,
            max_capacity=1024,
            bucket_capacity=128,
            score_strategy=strategy,
            local_hbm_for_values=1 << 24,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.1, upper=0.1),
        )
        for d in (8, 8)
    ]
    return unchecked_module(opts, opt, pooling, device, 0.05, **kw)


def _batches(device, steps):
    return random_batches(device, steps, batch=32, vocab=500, seed=3)


def _train(module, step_fn, batches, after_first=None):
    outs = []
    for i, (keys, offsets) in enumerate(batches):
        out = step_fn(keys, offsets)
        (out * out).sum().backward()
        outs.append(out.detach().cpu())
        if i == 0 and after_first is not None:
            after_first()
    return outs


def _rows(module):
    """Every stored key's embedding and state, by (table, key)."""
    rows = {}
    for t in range(len(module.table_options)):
        for chunk in module.rows.export_rows(t, 4096):
            for i, k in enumerate(chunk.keys.tolist()):
                state = None if chunk.optimizer_state is None else chunk.optimizer_state[i].cpu()
                rows[(t, k)] = (chunk.embeddings[i].cpu(), state)
    return rows


def _check_compiled_training(device, optimizer, pooling, strategy, backend):
    batches = _batches(device, 5)
    eager = _module(device, optimizer, pooling, strategy)
    compiled = _module(device, optimizer, pooling, strategy)
    want = _train(eager, eager, batches)
    counter = CompileCounterWithBackend(backend)
    step = torch.compile(compiled, fullgraph=True, backend=counter, dynamic=True)
    config = {"allow_unspec_int_on_nn_module": True}
    if device == "cpu":
        config["capture_scalar_outputs"] = True
    first = []
    with torch._dynamo.config.patch(**config):
        got = _train(compiled, step, batches, lambda: first.append(counter.frame_count))
    # Traced at the first step (dynamo may restart its analysis once there,
    # specializing the float hyper-parameters) and reused by every later
    # step; a graph break would fail under fullgraph=True.
    assert first[0] >= 1
    assert counter.frame_count == first[0], (first[0], counter.frame_count)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"step {i}")
    assert compiled.step == eager.step == len(batches)
    got_rows, want_rows = _rows(compiled), _rows(eager)
    assert got_rows.keys() == want_rows.keys()
    for k, (emb, state) in want_rows.items():
        assert torch.equal(got_rows[k][0], emb), k
        if state is not None:
            assert torch.equal(got_rows[k][1], state), k


S = DynamicEmbScoreStrategy


@pytest.mark.parametrize(
    "optimizer,pooling,strategy",
    [
        ("sgd", "SUM", S.STEP),
        ("adam", "NONE", S.LFU),
        ("ftrl", "MEAN", S.TIMESTAMP),
        ("rmsprop_ar", "SUM", S.LFU),
    ],
)
def test_compiled_training_step_has_one_graph_and_trains_like_eager(optimizer, pooling, strategy):
    _check_compiled_training("cpu", optimizer, pooling, strategy, "aot_eager")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize(
    "optimizer,pooling", [("sgd", "SUM"), ("adam", "NONE"), ("rmsprop_ar", "SUM")]
)
def test_cuda_compiled_training_step(optimizer, pooling, backend):
    _check_compiled_training("cuda", optimizer, pooling, S.STEP, backend)
