"""BatchedDynamicEmbeddingTablesV2 against FBGEMM's TBE as a twin.

FBGEMM's SplitTableBatchedEmbeddingBagsCodegen (TorchRec's own static tables)
gets dense tables whose row k is the row the dynamic table creates for key k
(the counter-based initializer), the same optimizer and hyper-parameters, and
the same batches; after every step the outputs and, at the end, every touched
row must agree within 1e-5. On the CPU, fbgemm-gpu-cpu covers SGD, Adagrad and
row-wise Adagrad; on the GPU all four optimizers run.
"""

import pytest
import torch

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2, init_rows

fbgemm = pytest.importorskip("fbgemm_gpu")
from fbgemm_gpu.split_embedding_configs import EmbOptimType as O  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # noqa: E402
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

ROWS = 300
HYPER = dict(learning_rate=0.05, eps=1e-4, beta1=0.8, beta2=0.95, weight_decay=0.0)
CPU_OPTIMIZERS = [O.EXACT_SGD, O.EXACT_ADAGRAD, O.EXACT_ROWWISE_ADAGRAD]
ALL_OPTIMIZERS = CPU_OPTIMIZERS + [O.ADAM]


def make_pair(device, optim, pooling, dims):
    init = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.1, upper=0.1)
    opts = [
        DynamicEmbTableOptions(dim=d, max_capacity=1024, bucket_capacity=128, initializer_args=init)
        for d in dims
    ]
    ours = BatchedDynamicEmbeddingTablesV2(opts, None, pooling, optim, device=device, **HYPER)
    cuda = torch.device(device).type == "cuda"
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [
            (
                ROWS,
                d,
                EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST,
                ComputeDevice.CUDA if cuda else ComputeDevice.CPU,
            )
            for d in dims
        ],
        optimizer=optim,
        pooling_mode=PoolingMode.SUM if pooling == DynamicEmbPoolingMode.SUM else PoolingMode.NONE,
        device=torch.device(device),
        **HYPER,
    )
    keys = torch.arange(ROWS, device=device)
    with torch.no_grad():
        for t, w in enumerate(tbe.split_embedding_weights()):
            w.copy_(init_rows(keys, dims[t], init, torch.full_like(keys, t), 0))
    return ours, tbe


def batches(device, dims, steps=10, B=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (len(dims) * B,), generator=g)
        # A few hot keys, so rows are updated by several occurrences at once.
        idx = torch.where(
            torch.rand(int(lengths.sum()), generator=g) < 0.3,
            torch.randint(0, 5, (int(lengths.sum()),), generator=g),
            torch.randint(0, ROWS, (int(lengths.sum()),), generator=g),
        )
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        out.append(
            (idx.to(device), offsets.to(device), torch.randn(B, sum(dims), generator=g).to(device))
        )
    return out


def run_twin(device, optim, pooling, dims):
    ours, tbe = make_pair(device, optim, pooling, dims)
    seen = [set() for _ in dims]
    B = 16
    for idx, offsets, grad in batches(device, dims, B=B):
        a, b = ours(idx, offsets), tbe(idx, offsets)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        if pooling == DynamicEmbPoolingMode.NONE:
            grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(int(idx.sum()))).to(
                device
            )
        a.backward(grad)
        b.backward(grad)
        for f in range(len(dims)):
            seen[f].update(idx[offsets[f * B] : offsets[(f + 1) * B]].tolist())
    for t, w in enumerate(tbe.split_embedding_weights()):
        keys = torch.tensor(sorted(seen[t]), device=device)
        found, emb, _ = ours.storage.read_rows(keys, torch.full_like(keys, t))
        assert bool(found.all())
        torch.testing.assert_close(emb[:, : dims[t]], w[keys], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("optim", CPU_OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize(
    "pooling", [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.NONE], ids=["sum", "none"]
)
def test_matches_fbgemm_tbe_on_cpu(optim, pooling):
    dims = (8, 16, 8) if pooling == DynamicEmbPoolingMode.SUM else (8, 8)
    run_twin("cpu", optim, pooling, dims)


@pytest.mark.gpu
@pytest.mark.parametrize("optim", ALL_OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize(
    "pooling", [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.NONE], ids=["sum", "none"]
)
def test_matches_fbgemm_tbe_on_cuda(optim, pooling):
    dims = (32, 64, 32) if pooling == DynamicEmbPoolingMode.SUM else (64, 64)
    run_twin("cuda", optim, pooling, dims)
