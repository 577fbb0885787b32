"""A training step of BatchedDynamicEmbeddingTablesV2 never reads the device
on the host: the padded segmented unique, the new rows written in place
(init_rows_at), and the step itself, on the CPU through the proxy of
sync_guard.py and on a GPU under ``torch.cuda.set_sync_debug_mode("error")``."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbOptimType,
    DynamicEmbTableOptions,
)
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb.embedding import segmented_unique
from dynamicemb.embedding.initializer import init_rows_at, initializer_op_args
from dynamicemb.embedding.optimizer import RowOptimizer
from dynamicemb.embedding.unique import PAD_KEY
from dynamicemb.storage import RowLayout
from dynamicemb.storage import space as sp
from dynamicemb.storage.rows import rows_buffer
from tests.devices import DEVICES
from tests.embedding.sync_guard import STEP_READS, HostSync, forbid_host_syncs
from tests.embedding.tbe_batches import random_batches, train_step, unchecked_module

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType


OPTIMIZERS = {
    "sgd": (EmbOptimType.EXACT_SGD, {}),
    "adam": (EmbOptimType.ADAM, {}),
    "rowwise_adagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, {}),
    "ftrl": (DynamicEmbOptimType.FTRL, {"initial_accumulator_value": 0.25}),
}


# ------------------------------------------------------------------ unique --


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(-5, 40), st.integers(0, 2)), max_size=50),
)
def test_padded_unique_is_the_exact_unique_then_padding(pairs):
    keys = torch.tensor([k for k, _ in pairs], dtype=torch.int64)
    tables = torch.tensor([t for _, t in pairs], dtype=torch.int64)
    exact = segmented_unique(keys, tables, 3)
    padded = segmented_unique(keys, tables, 3, padded=True)
    u, n = exact.keys.numel(), keys.numel()
    assert int(padded.num_unique) == int(exact.num_unique) == u
    assert padded.keys.numel() == padded.table_ids.numel() == padded.counts.numel() == n
    assert torch.equal(padded.keys[:u], exact.keys)
    assert torch.equal(padded.table_ids[:u], exact.table_ids)
    assert torch.equal(padded.counts[:u], exact.counts)
    assert (padded.keys[u:] == PAD_KEY).all() and (padded.table_ids[u:] == 2).all()
    assert (padded.counts[u:] == 0).all()
    assert torch.equal(padded.valid(), torch.arange(n) < u)
    for name in ("inverse", "order", "table_offsets"):
        assert torch.equal(getattr(padded, name), getattr(exact, name)), name


# ------------------------------------------------------------ init_rows_at --


INIT_MODES = {
    "normal": DynamicEmbInitializerArgs(mode=Mode.NORMAL, mean=0.1, std_dev=0.5),
    "uniform": DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.3, upper=0.2),
    "truncated": DynamicEmbInitializerArgs(
        mode=Mode.TRUNCATED_NORMAL, mean=0.0, std_dev=1.0, lower=-0.5, upper=0.5
    ),
    "constant": DynamicEmbInitializerArgs(mode=Mode.CONSTANT, value=0.7),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize(
    "dim,mode",
    [(5, "normal"), (8, "normal"), (130, "normal")]
    + [(d, m) for d in (7, 130) for m in ("uniform", "truncated", "constant")],
)
def test_init_rows_at_writes_the_rows_staging_writes(device, dtype, optimizer, dim, mode):
    """Bytes for bytes what the staged path (initializer rows, element by
    element, and the optimizer's initial state packed into a buffer, then
    copied) writes, at the given offsets only: init_rows_at's shared draws
    (four elements of one UNIFORM draw, two of one normal pair) change no
    value. Dims 7 and 5 end inside a block of four, 130 takes more blocks
    than a warp has lanes."""
    opt, kw = OPTIMIZERS[optimizer]
    row_opt = RowOptimizer(opt, **kw)
    layout = RowLayout([dim], dtype, opt, True)
    args = INIT_MODES[mode]
    n = 9
    keys = (torch.arange(100, 100 + n) * 7919).to(device)
    init_ids = torch.full((n,), 3, device=device)  # the generator's table id (the layout's is 0)
    rb = layout.row_bytes[0]
    rows = torch.tensor([0, -1, 2, 3, -1, 5, 6, -1, 8], device=device)
    offsets = torch.where(rows >= 0, rows * rb, -1)
    got = torch.full((n * rb,), 0xAB, dtype=torch.uint8, device=device)
    sdim = layout.state_dims[0]
    init_rows_at(
        (got, got.new_empty(0)),
        offsets,
        keys,
        init_ids,
        dim,
        initializer_op_args(args),
        11,
        layout.element_type,
        sdim,
        row_opt.state_fill(sdim),
    )

    class Init:
        def embeddings(self, k, t):
            from dynamicemb.embedding import init_rows

            return init_rows(k, dim, args, torch.full_like(k, 3), 11)

        def init_state(self, state):
            row_opt.init_state(state)

    want = torch.full((n * rb,), 0xAB, dtype=torch.uint8, device=device)
    keep = offsets >= 0
    tids = torch.zeros(int(keep.sum()), dtype=torch.int64, device=device)
    buf = rows_buffer(keys[keep], tids, None, None, None, Init(), layout)
    sp.copy_rows(
        (want, want.new_empty(0)),
        offsets[keep],
        sp.as_space(buf),
        sp.staging_offsets(tids.numel(), layout, keys.device),
        layout.row_bytes_of(tids),
    )
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_init_rows_at_opcheck(device):
    """The op's schema (both segments written in place), its fake kernel
    against the real one, and tracing."""
    from dynamicemb.table import ops

    layout = RowLayout([6], torch.float16, EmbOptimType.ADAM, True)
    rb = layout.row_bytes[0]
    seg = torch.zeros(4 * rb, dtype=torch.uint8, device=device)
    keys = torch.tensor([5, 9, 11], device=device)
    offsets = torch.tensor([2 * rb, -1, 0], device=device)
    args = initializer_op_args(INIT_MODES["uniform"])
    torch.library.opcheck(
        ops().init_rows_at.default,
        (seg, seg.new_empty(0), offsets, keys, torch.zeros_like(keys), 6, *args, 7)
        + (layout.element_type, layout.state_dims[0], 1, 0.5),
    )


def test_init_rows_at_refuses_rows_outside_the_space():
    layout = RowLayout([4], torch.float32, EmbOptimType.EXACT_SGD, True)
    seg = torch.zeros(32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="row offset 24 at index 1"):
        init_rows_at(
            (seg, seg.new_empty(0)),
            torch.tensor([0, 24]),
            torch.tensor([1, 2]),
            torch.tensor([0, 0]),
            4,
            initializer_op_args(DynamicEmbInitializerArgs()),
            0,
            layout.element_type,
            0,
        )


# ------------------------------------------------------ the training step --


def _module(device, optimizer, pooling, dims=(16, 16), mixed_init=False):
    opt, kw = OPTIMIZERS[optimizer]
    opts = []
    for t, d in enumerate(dims):
        mode = Mode.UNIFORM if (mixed_init and t) else Mode.NORMAL
        opts.append(
            DynamicEmbTableOptions(
                dim=d,
                max_capacity=4096,
                bucket_capacity=128,
                local_hbm_for_values=1 << 24,
                initializer_args=DynamicEmbInitializerArgs(mode=mode, std_dev=0.05),
            )
        )
    return unchecked_module(opts, opt, pooling, device, 0.1, **kw)


def _batches(device, steps):
    return random_batches(device, steps, batch=64, vocab=3000, seed=0, weights=True)


CASES = [
    ("sgd", "SUM", (16, 16), False, None),
    ("adam", "NONE", (16, 16), False, "frequency_counters"),
    ("rowwise_adagrad", "MEAN", (16, 16), False, None),
    ("ftrl", "SUM", (16, 16), False, "pooling_weights"),
    ("adam", "SUM", (8, 24), True, None),  # two dims and initializers: two init groups
]


@pytest.mark.parametrize("optimizer,pooling,dims,mixed_init,extra", CASES)
def test_training_step_reads_nothing_from_the_device(optimizer, pooling, dims, mixed_init, extra):
    module = _module("cpu", optimizer, pooling, dims, mixed_init)
    for batch in _batches("cpu", 4):
        with forbid_host_syncs(allow=STEP_READS):
            train_step(module, batch, extra)
    assert int(module.insert_failures.sum()) == 0
    assert int(module.rows.hash_table.size().sum()) > 0


def test_the_proxy_catches_a_read(monkeypatch):
    """The guard is live: the step with the exact unique (which reads the
    number of distinct keys) fails."""
    import dynamicemb.embedding.batched_tables as bt

    module = _module("cpu", "sgd", "SUM")
    batch = _batches("cpu", 1)[0]
    monkeypatch.setattr(bt, "segmented_unique", lambda k, t, n, padded: segmented_unique(k, t, n))
    with pytest.raises(HostSync, match="__int__"):
        with forbid_host_syncs(allow=STEP_READS):
            train_step(module, batch, None)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer,pooling,dims,mixed_init,extra", CASES)
def test_cuda_training_step_never_synchronizes(optimizer, pooling, dims, mixed_init, extra):
    module = _module("cuda", optimizer, pooling, dims, mixed_init)
    twin = _module("cpu", optimizer, pooling, dims, mixed_init)
    batches = _batches("cuda", 4)
    for i, batch in enumerate(batches):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            train_step(module, batch, extra)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        train_step(twin, tuple(t.cpu() for t in batch), extra)
        keys, offsets, _ = batch
        module.eval(), twin.eval()
        with torch.no_grad():
            got = module(keys, offsets).cpu()
            want = twin(keys.cpu(), offsets.cpu())
        module.train(), twin.train()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"step {i}")
