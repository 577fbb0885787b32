"""Embeddings stored at float16 and bfloat16: every tier keeps them so, the
optimizer state stays float32, and the arithmetic is float32 rounded to the
storage dtype (as FBGEMM keeps float16 weights with float32 state)."""

import pytest
import torch

from dynamicemb import DynamicEmbPoolingMode as Pool
from tests.devices import DEVICES
from tests.storage.storage_cases import assert_trains_like_device, batches, module, seen_keys, train

HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("mode", ["hybrid", "cache", "cache_small", "external_cache"])
def test_half_precision_tiers_train_like_the_all_device_module(mode, dtype, device):
    m, _, _ = assert_trains_like_device(
        mode, "adam", Pool.SUM, device, dims=(8, 5), steps=12, dtype=dtype
    )
    assert m.embedding_dtype == dtype


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_sgd_is_float32_arithmetic_rounded_to_the_storage_dtype(dtype):
    """A dense model of the same rule: rows kept at ``dtype``; each step's
    row is ``round(float32(row) - lr * float32 gradient)``, the pooled output
    the float32 sum of the stored rows."""
    m = module("cache", dims=(6,), optimizer="sgd", dtype=dtype)
    lr = 0.3
    data = batches(10, 1, batch=16, vocab=300)
    rows: dict[int, torch.Tensor] = {}
    for step, (indices, offsets) in enumerate(data):
        out = m(indices, offsets)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + step))
        want = torch.zeros(out.shape)
        grads: dict[int, torch.Tensor] = {}
        for b in range(offsets.numel() - 1):
            for j in range(int(offsets[b]), int(offsets[b + 1])):
                k = int(indices[j])
                if k not in rows:
                    rows[k] = m.initial_embeddings(torch.tensor([k]), torch.tensor([0]))[0].to(
                        dtype
                    )
                want[b] += rows[k].float()
                grads[k] = grads.get(k, torch.zeros(6)) + grad[b]
        torch.testing.assert_close(out.detach(), want, rtol=1e-6, atol=1e-6)
        out.backward(grad)
        for k, g in grads.items():
            rows[k] = (rows[k].float() - lr * g).to(dtype)
    keys = torch.tensor(sorted(rows))
    found, emb, _ = m.storage.read_rows(keys, torch.zeros_like(keys))
    assert bool(found.all())
    want = torch.stack([rows[int(k)].float() for k in keys])
    # One rounding apart at most where the gradient sums differ in order.
    torch.testing.assert_close(emb[:, :6], want, rtol=2 * torch.finfo(dtype).eps, atol=1e-6)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_optimizer_state_stays_float32(dtype):
    m = module("hybrid", dims=(8,), optimizer="adam", dtype=dtype)
    data = batches(3, 1)
    train(m, data)
    keys = torch.tensor(sorted(seen_keys(data, [0])[0]))
    found, emb, state = m.storage.read_rows(keys, torch.zeros_like(keys))
    assert bool(found.all())
    # Embeddings are values of the storage dtype ...
    assert torch.equal(emb[:, :8], emb[:, :8].to(dtype).float())
    # ... while Adam's second moments (about (1 - 0.999) g^2) include values
    # the storage dtype cannot hold exactly.
    v = state[:, 8:16]
    assert not torch.equal(v, v.to(dtype).float())
    rows = next(iter(m.rows.export_rows(0, 1 << 20)))
    assert rows.embeddings.dtype == dtype and rows.optimizer_state.dtype == torch.float32
