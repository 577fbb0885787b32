"""A lookup exported (``torch.export``, saved and loaded back) and compiled
(``torch.compile(fullgraph=True)``): the same results as the eager module,
for batches of any size, and a compiled module keeps its one graph when a
new checkpoint is swapped in."""

import io

import pytest
import torch

from dynamicemb import DynamicEmbPoolingMode as P
from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
from tests.inference import inference_harness as ih


def _table(path, dtype, pooling=P.SUM, names=("t0", "t1", "t2")):
    configs = [InferenceTableConfig(n, feature_names=[f"f_{n}"]) for n in names]
    return InferenceEmbeddingTable.from_checkpoint(path, configs, dtype=dtype, pooling=pooling)


def _batches(num_features):
    """Batches of several sizes: B of 0, 1 and more, bags of 0 ids."""
    yield torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.ones(0)
    for seed, b in ((1, 1), (2, 5), (3, 9)):
        yield ih.batch(num_features, b, seed)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float16])
def test_an_exported_lookup_saved_and_loaded_gives_the_eager_results(job, dtype, tmp_path):
    _, path, _ = job
    table = _table(path, dtype)
    ids, offsets, weights = ih.batch(3, 4, 0)
    program = table.export(ids, offsets, weights)
    file = tmp_path / "lookup.pt2"
    torch.export.save(program, str(file))
    loaded = torch.export.load(str(file)).module()
    for ids, offsets, weights in _batches(3):
        want = table(ids, offsets, weights)
        torch.testing.assert_close(loaded(ids, offsets, weights), want, rtol=0, atol=1e-6)
    # PyTorch's ops alone: no op of the extension (the eager lookup's
    # one-pass pooling of float16 and FP8 rows is dynamicemb's).
    targets = {str(n.target) for n in program.graph_module.graph.nodes}
    assert not [t for t in targets if "dynamicemb" in t], targets
    # The program is a snapshot: the module's later rows do not reach it.
    before = loaded(ids, offsets, weights)
    table.load_checkpoint(path)
    assert torch.equal(loaded(ids, offsets, weights), before)


def test_an_exported_sequence_lookup_of_a_keyed_jagged_tensor(job):
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

    _, path, rows = job
    table = _table(path, torch.int8, P.NONE, names=("t0", "t1"))
    kjt = KeyedJaggedTensor(
        keys=["f_t1", "f_t0"],
        values=torch.cat([rows["t1"]["keys"][:4], torch.tensor([10**10, 3])]),
        lengths=torch.tensor([1, 3, 2, 0]),
    )
    program = torch.export.export(table, (kjt,))
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    # The program keeps its example input, a KJT: TorchRec's classes are
    # loaded as trusted.
    with torch.serialization.safe_globals([KeyedJaggedTensor, JaggedTensor]):
        got = torch.export.load(buf).module()(kjt)
    want = table(kjt)
    assert sorted(got) == sorted(want) == ["f_t0", "f_t1"]
    for f in want:
        assert torch.equal(got[f].values(), want[f].values())
        assert torch.equal(got[f].lengths(), want[f].lengths())


def test_a_compiled_lookup_has_no_graph_break_and_keeps_its_graph_across_swaps(job, bf16_job):
    from torch._dynamo.testing import CompileCounterWithBackend

    _, path, _ = job
    _, other, _ = bf16_job
    table = _table(path, torch.int8)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(table, fullgraph=True, backend=counter, dynamic=True)
    batches = list(_batches(3))[1:]
    for ids, offsets, weights in batches:
        torch.testing.assert_close(compiled(ids, offsets, weights), table(ids, offsets, weights))
    graphs = counter.frame_count
    for source in (other, path, other):  # new rows, other table sizes: the same graph
        table.load_checkpoint(source)
        for ids, offsets, weights in batches:
            want = table(ids, offsets, weights)
            torch.testing.assert_close(compiled(ids, offsets, weights), want)
    assert counter.frame_count == graphs


@pytest.mark.parametrize("pooling", [P.MEAN, P.NONE])
def test_compiled_mean_and_sequence_lookups_give_the_eager_results(job, pooling):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    _, path, _ = job
    table = _table(path, torch.float8_e4m3fn, pooling, names=("t0", "t1"))
    torch._dynamo.reset()
    compiled = torch.compile(table, fullgraph=True, backend="aot_eager")
    ids, offsets, _ = ih.batch(2, 4, 7)
    torch.testing.assert_close(compiled(ids, offsets), table(ids, offsets))
    lengths = offsets[1:] - offsets[:-1]
    kjt = KeyedJaggedTensor(keys=["f_t0", "f_t1"], values=ids, lengths=lengths)
    got, want = compiled(kjt), table(kjt)
    if pooling == P.MEAN:
        torch.testing.assert_close(got.values(), want.values())
    else:
        for f in want:
            torch.testing.assert_close(got[f].values(), want[f].values())
