"""The INT8 inference table against TorchRec's quantized
EmbeddingBagCollection (FBGEMM's INT8 inference TBE, on the CPU with
fbgemm-gpu-cpu), on the same rows and bags:

* TorchRec quantizing the float rows itself (``from_float``): both tables
  are within their own quantization bounds of the float64 sums, so they are
  within the sum of both bounds of each other;
* TorchRec given the inference table's own codes (its scale and bias
  rounded to the float16 its layout keeps): FBGEMM's kernel reads the codes
  as the inference table does, the difference bounded by that rounding.

TorchRec's tables index rows densely: a key is its row's rank among the
table's keys."""

import pytest
import torch

from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig

pytest.importorskip("torchrec.quant.embedding_modules")


def _dense_batch(rows, names, seed, batch_size=6, max_length=6):
    """A KJT of held keys of every table, the same bags as dense indices,
    and weights."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    keys, dense, lengths = [], [], []
    for n in names:
        held = rows[n]["keys"]
        for _ in range(batch_size):
            m = int(torch.randint(0, max_length + 1, (1,), generator=g))
            idx = torch.randint(0, held.numel(), (m,), generator=g)
            keys.append(held[idx])
            dense.append(idx)
            lengths.append(m)
    weights = torch.rand(sum(lengths), generator=g) * 2 - 0.5
    feats = [f"f_{n}" for n in names]
    lengths = torch.tensor(lengths)
    ours = KeyedJaggedTensor(keys=feats, values=torch.cat(keys), lengths=lengths, weights=weights)
    theirs = KeyedJaggedTensor(
        keys=feats, values=torch.cat(dense), lengths=lengths, weights=weights
    )
    return ours, theirs


def _configs(rows, names):
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

    return [
        EmbeddingBagConfig(
            name=n,
            num_embeddings=rows[n]["keys"].numel(),
            embedding_dim=rows[n]["emb"].shape[1],
            feature_names=[f"f_{n}"],
            data_type=DataType.INT8,
        )
        for n in names
    ]


def _pooled_bound(per_value, kjt, weights):
    """(B, sum of dims): per output value, the sum over its bag of |w| times
    the bound of each row's values (``per_value[f]``: (n_f, dim) per id of
    feature f)."""
    out = []
    offsets = kjt.offsets()
    batch = kjt.stride()
    for b in range(batch):
        parts = []
        for f, bound in enumerate(per_value):
            lo, hi = int(offsets[f * batch + b]), int(offsets[f * batch + b + 1])
            base = int(offsets[f * batch])
            w = weights[lo:hi].abs().double()[:, None]
            parts.append((w * bound[lo - base : hi - base]).sum(0) + 1e-6)
        out.append(torch.cat(parts))
    return torch.stack(out)


def test_int8_lookups_agree_with_torchrec_quantizing_the_same_rows(job):
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    cs, path, rows = job
    names = [t.name for t in cs.tables]
    ebc = EmbeddingBagCollection(tables=_configs(rows, names), is_weighted=True)
    with torch.no_grad():
        for n in names:
            ebc.embedding_bags[n].weight.copy_(rows[n]["emb"].float())
    ebc.qconfig = torch.quantization.QConfig(
        activation=torch.quantization.PlaceholderObserver.with_args(dtype=torch.float),
        weight=torch.quantization.PlaceholderObserver.with_args(dtype=torch.qint8),
    )
    qebc = QuantEBC.from_float(ebc)
    table = InferenceEmbeddingTable.from_checkpoint(
        path, [InferenceTableConfig(n, feature_names=[f"f_{n}"]) for n in names], dtype=torch.int8
    )
    for seed in range(3):
        ours, theirs = _dense_batch(rows, names, seed)
        got, want = table(ours).values(), qebc(theirs).values()
        # Each within its own bound of the float64 sums: ours half a step,
        # TorchRec's half a step of its float16 scale plus the float16
        # rounding of its bias and scale.
        per_value = []
        for f, n in enumerate(names):
            lo, hi = theirs.offset_per_key()[f], theirs.offset_per_key()[f + 1]
            r = rows[n]["emb"][theirs.values()[lo:hi]]
            lo, hi = r.amin(1, keepdim=True), r.amax(1, keepdim=True)
            step = (hi - lo) / 255
            fbgemm = step / 2 * (1 + 2.0**-10) + 2.0**-11 * (lo.abs() + hi - lo)
            per_value.append((step / 2 + fbgemm).expand_as(r) + r.abs() * 2.0**-20)
        bound = _pooled_bound(per_value, theirs, theirs.weights())
        assert float(((got.double() - want.double()).abs() - bound).max()) <= 0


def test_fbgemm_reads_the_inference_tables_int8_codes_as_it_does(job):
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    cs, path, rows = job
    names = [t.name for t in cs.tables]
    table = InferenceEmbeddingTable.from_checkpoint(
        path, [InferenceTableConfig(n, feature_names=[f"f_{n}"]) for n in names], dtype=torch.int8
    )
    weights, qparams = {}, {}
    for n in names:
        keys, stored = table.stored_rows(n)
        assert torch.equal(keys, rows[n]["keys"])
        dim = rows[n]["emb"].shape[1]
        qp = stored[:, dim:].contiguous().view(torch.float32)  # scale, bias
        weights[n] = (stored[:, :dim].contiguous(), qp.half().contiguous().view(torch.uint8))
        qparams[n] = (stored[:, :dim].double(), qp.double(), qp.half().double())
    qebc = QuantEBC(
        _configs(rows, names),
        is_weighted=True,
        device=torch.device("cpu"),
        table_name_to_quantized_weights=weights,
    )
    for seed in range(3):
        ours, theirs = _dense_batch(rows, names, seed + 10)
        got, want = table(ours).values(), qebc(theirs).values()
        per_value = []
        for f, n in enumerate(names):
            idx = theirs.values()[theirs.offset_per_key()[f] : theirs.offset_per_key()[f + 1]]
            codes, exact, half = (q[idx] for q in qparams[n])
            diff = codes * (exact[:, :1] - half[:, :1]).abs() + (exact[:, 1:] - half[:, 1:]).abs()
            per_value.append(diff + (codes * exact[:, :1]).abs() * 2.0**-20)
        bound = _pooled_bound(per_value, theirs, theirs.weights())
        assert float(((got.double() - want.double()).abs() - bound).max()) <= 0
