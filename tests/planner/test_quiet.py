"""The documented way to build a topology and a planner, and to plan a model
with dynamic tables, warns about nothing: no warning, no log record of
WARNING or above (TorchRec's notices about a topology built directly and
about its heuristic storage reservation are not given, their causes being
avoided)."""

import logging
import warnings

import torch
from torchrec.distributed.planner.types import Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynamicemb import DynamicEmbTableOptions
from dynamicemb.planner import (
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    topology,
)
from dynamicemb.shard import DynamicEmbeddingBagCollectionSharder


def _configs():
    return [
        EmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=4096, feature_names=["u"]),
        EmbeddingBagConfig(name="item", embedding_dim=8, num_embeddings=100, feature_names=["i"]),
    ]


def _plan(topo):
    configs = _configs()
    constraints = {
        "user": DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(),
        ),
        "item": DynamicEmbParameterConstraints(sharding_types=["table_wise"]),
    }
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs, topology=topo, constraints=constraints, batch_size=32, debug=False
    )
    model = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    return planner.plan(model, [DynamicEmbeddingBagCollectionSharder()])


def _said(caplog, fn):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        fn()
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return [str(w.message) for w in caught] + logged


def test_the_documented_topology_and_planner_warn_about_nothing(caplog):
    said = _said(caplog, lambda: _plan(topology(world_size=2, compute_device="cpu")))
    assert said == []
    # The default topology (one process, no process group) too.
    assert _said(caplog, lambda: _plan(None)) == []


def test_topology_is_the_one_torchrec_builds_directly():
    for device, caps in (("cpu", {}), ("cuda", {"hbm_cap": 1 << 30, "ddr_cap": 1 << 34})):
        ours = topology(world_size=4, compute_device=device, local_world_size=2, **caps)
        theirs = Topology(world_size=4, compute_device=device, local_world_size=2, **caps)
        assert repr(ours) == repr(theirs)
        assert [d.storage for d in ours.devices] == [d.storage for d in theirs.devices]
