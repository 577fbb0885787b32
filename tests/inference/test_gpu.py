"""The inference table on CUDA against the same table on the CPU (the
reference): every format's pooled and sequence lookups, random default
rows, a delta applied on the device, and a lookup exported and compiled
on the device."""

import pytest
import torch

from dynamicemb import DynamicEmbInitializerArgs, DynamicEmbInitializerMode
from dynamicemb import DynamicEmbPoolingMode as P
from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
from tests.inference import inference_harness as ih

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.int8]
CUDA = torch.device("cuda")


def _pair(path, dtype, pooling=P.SUM, names=("t0", "t1", "t2"), **kw):
    configs = [InferenceTableConfig(n, feature_names=[f"f_{n}"], **kw) for n in names]
    return [
        InferenceEmbeddingTable.from_checkpoint(
            path, configs, dtype=dtype, pooling=pooling, device=d
        )
        for d in ("cpu", CUDA)
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("pooling", [P.SUM, P.MEAN])
def test_cuda_pooled_lookups_equal_the_cpu_ones(job, dtype, pooling):
    _, path, _ = job
    cpu, gpu = _pair(path, dtype, pooling)
    for seed in range(3):
        ids, offsets, weights = ih.batch(3, 16, seed)
        w = weights if pooling == P.SUM else None
        got = gpu(ids.to(CUDA), offsets.to(CUDA), None if w is None else w.to(CUDA))
        torch.testing.assert_close(got.cpu(), cpu(ids, offsets, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_cuda_sequence_lookups_and_random_defaults_equal_the_cpu_ones(job, dtype):
    _, path, _ = job
    default = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.05)
    cpu, gpu = _pair(path, dtype, P.NONE, names=("t0", "t1"), default=default)
    ids, offsets, _ = ih.batch(2, 16, 5, key_range=(-100, 2000))
    got = gpu(ids.to(CUDA), offsets.to(CUDA))
    torch.testing.assert_close(got.cpu(), cpu(ids, offsets), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_a_delta_applied_on_cuda_gives_the_cpu_rows(job, dtype):
    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.replication import DeltaDumpResult

    _, path, rows = job
    cpu, gpu = _pair(path, dtype, names=("t2",))
    keys = torch.cat([rows["t2"]["keys"][:10], torch.arange(10**6, 10**6 + 20)])
    d = DeltaDumpResult()
    d.append(
        {
            "table_names": "t2",
            "keys": keys,
            "values": torch.randn(keys.numel(), 4),
            "optimizer_states": None,
            "scores": torch.zeros(keys.numel(), 1, dtype=torch.int64),
            "erased_keys": rows["t2"]["keys"][10:15],
            "evicted_keys": torch.empty(0, dtype=torch.int64),
            "meta": {"num_scores": 1, "table_options": DynamicEmbTableOptions(dim=4)},
        }
    )
    for table in (cpu, gpu):
        table.apply_delta({"model.sparse.coll": d})
    probe = torch.cat([keys, rows["t2"]["keys"]])
    assert torch.equal(gpu.rows("t2", probe.to(CUDA)).cpu(), cpu.rows("t2", probe))
    assert gpu.sizes() == cpu.sizes()


def test_a_lookup_exports_and_compiles_on_cuda(job, tmp_path):
    _, path, _ = job
    _, gpu = _pair(path, torch.int8)
    ids, offsets, weights = (t.to(CUDA) for t in ih.batch(3, 8, 9))
    want = gpu(ids, offsets, weights)
    program = gpu.export(ids, offsets, weights)
    torch.export.save(program, str(tmp_path / "lookup.pt2"))
    loaded = torch.export.load(str(tmp_path / "lookup.pt2")).module()
    torch.testing.assert_close(loaded(ids, offsets, weights), want, rtol=0, atol=1e-6)
    torch._dynamo.reset()
    compiled = torch.compile(gpu, fullgraph=True)
    torch.testing.assert_close(compiled(ids, offsets, weights), want, rtol=1e-5, atol=1e-5)
