"""A dynamic sharder's fused_params reach its dynamic tables; TorchRec's
tables of the same collection take static_fused_params where given, else the
sharder's fused_params as TorchRec's own sharder gives them; fused_params of
an optimizer TorchRec lacks with no static_fused_params are refused naming
the table and the option (gloo, one rank)."""

import pytest
import torch
import torch.distributed as dist

from tests.shard import shard_harness as h

T = h.TableSpec


def _scenario():
    return h.Scenario(
        name="mixed",
        kind="ebc",
        tables=[T("dyn", 64, 4), T("stat", 16, 4, dynamic=False, static_sharding="table_wise")],
    )


def _build(static_fused_params, optimizer=None):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from dynamicemb.shard import DynamicEmbeddingBagCollectionSharder

    sc = _scenario()
    collection = h.build_collection(sc, torch.device("cpu"))
    # Adam for the dynamic table (dynamicemb runs it on the CPU; FBGEMM's CPU
    # kernel of TorchRec's tables does not).
    sharder = DynamicEmbeddingBagCollectionSharder(
        fused_params={"optimizer": optimizer or EmbOptimType.ADAM, "learning_rate": 0.01},
        static_fused_params=static_fused_params,
    )
    plan = h.hand_plan(sc, collection, sharder, 1, "cpu")
    model = DistributedModelParallel(
        h.ScenarioModel(collection),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=ShardingPlan({"coll": plan}),
        sharders=[sharder],
    )
    return model, sc


def _static_optimizer(model):
    for lookup in model.module.coll._lookups:
        for module in lookup._emb_modules:
            for table in module.config.embedding_tables:
                if table.name == "stat":
                    return str(module.config.fused_params["optimizer"].name)
    return None


def _optimizers(rank, world):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb import DynamicEmbOptimType
    from dynamicemb.shard import dynamic_embedding_kernels

    model, sc = _build({"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5})
    dynamic = {
        name: str(k.emb_module.optimizer.optimizer.name)
        for k in dynamic_embedding_kernels(model)
        for name in k.table_names
    }
    static = {"stat": _static_optimizer(model)}
    kjt = h.to_kjt(sc, h.batch_for(sc, 0, rank))
    model(kjt).values().sum().backward()  # trains: Adam never reaches FBGEMM's CPU kernel
    # Without static_fused_params TorchRec's table takes the sharder's, as
    # TorchRec's own sharder gives them.
    shared = _static_optimizer(_build(None, EmbOptimType.EXACT_ROWWISE_ADAGRAD)[0])
    refused = None
    try:
        _build(None, DynamicEmbOptimType.FTRL)
    except ValueError as e:
        refused = str(e)
    return {"dynamic": dynamic, "static": static, "shared": shared, "refused": refused}


def test_fused_params_reach_the_dynamic_tables_and_static_ones_their_own():
    got = h.run_world(_optimizers, 1)[0]
    assert got["dynamic"] == {"dyn": "ADAM"}
    assert got["static"] == {"stat": "EXACT_SGD"}
    assert got["shared"] == "EXACT_ROWWISE_ADAGRAD"
    assert got["refused"] is not None
    assert "['stat']" in got["refused"] and "static_fused_params" in got["refused"]


@pytest.mark.parametrize("kind", ["ec", "ebc"])
def test_a_sharder_keeps_static_fused_params(kind):
    from dynamicemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )

    classes = {"ec": DynamicEmbeddingCollectionSharder, "ebc": DynamicEmbeddingBagCollectionSharder}
    cls = classes[kind]
    sharder = cls(fused_params={"learning_rate": 0.1}, static_fused_params={"learning_rate": 0.2})
    assert sharder.fused_params == {"learning_rate": 0.1}
    assert sharder.static_fused_params == {"learning_rate": 0.2}
    assert cls().static_fused_params is None
