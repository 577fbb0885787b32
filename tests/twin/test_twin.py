"""construct_twin_module: the TorchRec twin of a model with dynamic tables.

Unsharded: the twin's rows are the rows BatchedDynamicEmbeddingTablesV2
creates for the same keys, and stay equal to them over SGD steps.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynamicemb import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbOptimType,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2, init_rows
from dynamicemb.planner import DynamicEmbParameterConstraints, prepare_table_options
from dynamicemb.twin import construct_twin_module, dynamic_table_ids, twin_rows

EBC_CONFIGS = [
    EmbeddingBagConfig(name="d0", embedding_dim=8, num_embeddings=300, feature_names=["f0"]),
    EmbeddingBagConfig(name="s0", embedding_dim=8, num_embeddings=50, feature_names=["f1"]),
    EmbeddingBagConfig(name="d1", embedding_dim=4, num_embeddings=200, feature_names=["f2"]),
]
EC_CONFIGS = [
    EmbeddingConfig(name="e0", embedding_dim=8, num_embeddings=100, feature_names=["g0"]),
]
NORMAL = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.05)


class Model(torch.nn.Module):
    def __init__(self, device="cpu"):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=EBC_CONFIGS, device=torch.device(device))
        self.ec = EmbeddingCollection(tables=EC_CONFIGS, device=torch.device(device))


def constraints():
    return {
        "d0": DynamicEmbParameterConstraints(use_dynamicemb=True, pooling_factors=[3.0]),
        "s0": DynamicEmbParameterConstraints(use_dynamicemb=False, sharding_types=["table_wise"]),
        "d1": DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(initializer_args=NORMAL)
        ),
        "e0": DynamicEmbParameterConstraints(use_dynamicemb=True),
    }


def test_twin_rows_are_the_dynamic_initializer_rows():
    model = Model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    twin, _ = construct_twin_module(model, constraints(), seed=7)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])  # the model is not touched
    weights = twin.state_dict()
    # d0: UNIFORM with bounds from its config; table id 0 in the EBC.
    bound = math.sqrt(1 / 300)
    uniform = DynamicEmbInitializerArgs(lower=-bound, upper=bound)
    keys = torch.arange(300)
    assert torch.equal(
        weights["ebc.embedding_bags.d0.weight"],
        init_rows(keys, 8, uniform, torch.zeros_like(keys), 7),
    )
    assert weights["ebc.embedding_bags.d0.weight"].abs().max() <= bound
    # d1: NORMAL, table id 1 (second dynamic table of the EBC).
    keys = torch.arange(200)
    assert torch.equal(
        weights["ebc.embedding_bags.d1.weight"],
        init_rows(keys, 4, NORMAL, torch.ones_like(keys), 7),
    )
    # e0: the first dynamic table of the EC.
    assert torch.equal(
        weights["ec.embeddings.e0.weight"],
        twin_rows(100, 8, DynamicEmbInitializerArgs(lower=-0.1, upper=0.1), 0, 7),
    )
    # The static table is the model's.
    assert torch.equal(
        weights["ebc.embedding_bags.s0.weight"], before["ebc.embedding_bags.s0.weight"]
    )
    assert dynamic_table_ids(model, constraints()) == {"d0": 0, "d1": 1, "e0": 0}


def test_twin_of_a_meta_model_has_cpu_rows_for_dynamic_tables():
    twin, _ = construct_twin_module(Model("meta"), constraints())
    assert twin.ebc.embedding_bags["d0"].weight.device.type == "cpu"
    assert twin.ebc.embedding_bags["s0"].weight.device.type == "meta"


def test_twin_constraints():
    given = constraints()
    _, twin_constraints = construct_twin_module(Model(), given)
    for name in ("d0", "d1", "e0"):
        c = twin_constraints[name]
        assert type(c) is ParameterConstraints
        assert c.sharding_types == ["row_wise"] and c.compute_kernels == ["fused"]
    assert twin_constraints["d0"].pooling_factors == [3.0]
    assert type(twin_constraints["s0"]) is ParameterConstraints
    assert twin_constraints["s0"].sharding_types == ["table_wise"]
    assert given["s0"].sharding_types == ["table_wise"] and given["d0"].sharding_types is None


def test_twin_refuses_ftrl_and_unknown_tables():
    with pytest.raises(ValueError, match="FTRL"):
        construct_twin_module(
            Model(), constraints(), fused_params={"optimizer": DynamicEmbOptimType.FTRL}
        )
    cons = constraints()
    cons["ghost"] = DynamicEmbParameterConstraints(use_dynamicemb=True)
    with pytest.raises(ValueError, match="ghost"):
        construct_twin_module(Model(), cons)
    with pytest.raises(ValueError, match="d1"):
        construct_twin_module(Model(), constraints(), table_ids={"d0": 0, "e0": 0})


@pytest.mark.parametrize("seed", [0, 3])
def test_twin_agrees_with_the_dynamic_module_over_sgd_steps(seed):
    """The EBC's dynamic tables d0 and d1 in one BatchedDynamicEmbeddingTablesV2
    (table ids 0 and 1, as dynamic_table_ids gives) against the twin's rows
    with torch's embedding_bag and SGD."""
    model = Model()
    cons = constraints()
    twin, _ = construct_twin_module(
        model, cons, fused_params={"optimizer": EmbOptimType.EXACT_SGD}, seed=seed
    )
    configs = {c.name: c for c in EBC_CONFIGS}
    options = [
        prepare_table_options(cons[name].dynamicemb_options, configs[name], 1)
        for name in ("d0", "d1")
    ]
    dims = [8, 4]
    lr = 0.1
    dyn = BatchedDynamicEmbeddingTablesV2(
        options,
        pooling_mode=DynamicEmbPoolingMode.SUM,
        optimizer=EmbOptimType.EXACT_SGD,
        seed=seed,
        learning_rate=lr,
    )
    weights = [
        twin.ebc.embedding_bags["d0"].weight.detach().clone().requires_grad_(True),
        twin.ebc.embedding_bags["d1"].weight.detach().clone().requires_grad_(True),
    ]
    g = torch.Generator().manual_seed(seed)
    batch = 5
    for _ in range(3):
        per_feature = []
        for vocab in (300, 200):
            lengths = torch.randint(0, 4, (batch,), generator=g)
            per_feature.append(
                (torch.randint(0, vocab, (int(lengths.sum()),), generator=g), lengths)
            )
        indices = torch.cat([i for i, _ in per_feature])
        offsets = torch.cat(
            [torch.zeros(1, dtype=torch.int64), torch.cat([n for _, n in per_feature]).cumsum(0)]
        )
        out = dyn(indices, offsets)
        # Reference: per table, SUM bags over the twin's rows.
        ref = []
        for t, (idx, lengths) in enumerate(per_feature):
            offs = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]])
            ref.append(F.embedding_bag(idx, weights[t], offs, mode="sum"))
        ref = torch.cat(ref, dim=1)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
        grad = torch.randn(out.shape, generator=g)
        out.backward(grad)
        (ref * grad).sum().backward()
        with torch.no_grad():
            for w in weights:
                w -= lr * w.grad
                w.grad = None
        # Every key seen so far has the twin's row in the dynamic table.
        for t, (idx, _) in enumerate(per_feature):
            keys = idx.unique()
            found, emb, _ = dyn.storage.read_rows(keys, torch.full_like(keys, t))
            assert bool(found.all())
            torch.testing.assert_close(
                emb[:, : dims[t]], weights[t][keys].detach(), rtol=0, atol=1e-6
            )


def test_initializer_table_ids_are_positions_among_dynamic_tables():
    from dynamicemb.planner.parameter_sharding import initializer_table_ids

    assert initializer_table_ids(["s0", "d0", "s1", "d1", "d2"], {"d2", "d0", "d1"}) == {
        "d0": 0,
        "d1": 1,
        "d2": 2,
    }
    assert initializer_table_ids(["s0"], set()) == {}
    with pytest.raises(ValueError, match="ghost"):
        initializer_table_ids(["d0"], {"d0", "ghost"})
    with pytest.raises(ValueError, match="'d0' appears twice"):
        initializer_table_ids(["d0", "d0"], {"d0"})


def test_module_initializer_table_ids_choose_the_rows():
    """A table fused at position 0 with initializer id 2 creates the rows of
    table id 2; a wrong count of ids is refused."""
    opts = [
        DynamicEmbTableOptions(
            dim=4, max_capacity=128, bucket_capacity=128, initializer_args=NORMAL
        )
    ]
    keys = torch.arange(5)
    m = BatchedDynamicEmbeddingTablesV2(opts, seed=3, initializer_table_ids=[2])
    out = m(keys, torch.arange(6))
    torch.testing.assert_close(
        out, init_rows(keys, 4, NORMAL, torch.full_like(keys, 2), 3), rtol=0, atol=0
    )
    assert not torch.equal(out, init_rows(keys, 4, NORMAL, torch.zeros_like(keys), 3))
    with pytest.raises(ValueError, match="initializer_table_ids has 2 entries for 1 tables"):
        BatchedDynamicEmbeddingTablesV2(opts, initializer_table_ids=[0, 1])
