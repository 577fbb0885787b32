"""A forward with gradients disabled (``torch.no_grad``, ``torch.inference_mode``)
reads as an eval forward, in training mode too: it inserts nothing, evicts
nothing, counts no step and returns what ``eval()`` returns."""

import pytest
import torch

from dynamicemb import DynamicEmbInitializerArgs, DynamicEmbTableOptions
from dynamicemb import DynamicEmbInitializerMode as Mode
from dynamicemb import DynamicEmbPoolingMode as Pool
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from tests.devices import DEVICES

EmbOptimType = pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType


def _module(device):
    # One table of one 16-slot bucket: full after the first batch.
    opts = [
        DynamicEmbTableOptions(
            dim=4,
            max_capacity=16,
            bucket_capacity=16,
            initializer_args=DynamicEmbInitializerArgs(mode=Mode.UNIFORM, lower=-0.5, upper=0.5),
        )
    ]
    return BatchedDynamicEmbeddingTablesV2(
        opts, None, Pool.NONE, EmbOptimType.EXACT_SGD, device=device, learning_rate=0.1
    )


def _state(m):
    t = m.rows.hash_table
    b = t.export_batch()
    keys = sorted(b.keys[: int(b.count)].tolist())
    return (
        int(t.size()[0]),
        int(t.counter("INSERTS")[0]),
        int(t.counter("EVICTIONS")[0]),
        m.step,
        keys,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("context", ["no_grad", "inference_mode"])
def test_grad_disabled_forward_in_train_mode_reads_as_eval(device, context):
    m = _module(device)
    trained = torch.arange(16, device=device)
    out = m(trained, torch.arange(17, device=device))  # fills the table
    (out * out).sum().backward()
    assert int(m.rows.hash_table.size()[0]) == 16
    new = torch.arange(100, 116, device=device)  # would evict every trained row
    batch = (torch.cat([trained[:4], new]), torch.arange(21, device=device))
    before = _state(m)
    assert m.training
    with getattr(torch, context)():
        got = m(*batch)
    assert _state(m) == before  # nothing inserted, evicted or counted
    m.eval()
    with torch.no_grad():
        want = m(*batch)
    assert _state(m) == before
    torch.testing.assert_close(got, want)
    # Found keys read their trained rows; missing ones the eval initializer's
    # (CONSTANT 0.0), not a new row.
    assert bool((got[4:] == 0).all()) and bool((got[:4] != 0).any())
    # With gradients, training mode trains again.
    m.train()
    m(*batch).sum().backward()
    assert _state(m)[3] == before[3] + 1 and int(m.rows.hash_table.counter("EVICTIONS")[0]) > 0
