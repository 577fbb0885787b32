"""dynamicemb.shard.plan_and_shard: a model planned over the ranks of a
process group and sharded by DistributedModelParallel in one call.

The sharders' suite (test_sharders.py) trains its planner scenarios through
it against the dense reference at two gloo ranks (and over NCCL on two or
more GPUs, its `multigpu` cases); here, a process
group other than the world (each of two gloo ranks shards a model of its
own over a group of one), and the refusals, each before any collective and
with the model left as it was.
"""

import os

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynamicemb.shard import plan_and_shard
from tests.shard import shard_harness as h

T = h.TableSpec
# Two dynamic tables, planned by DynamicEmbeddingShardingPlanner.
TABLES = [T("d0", 40, 4, dist_type="hash_roundrobin"), T("d1", 30, 2, pooling="MEAN")]
SCENARIO = h.Scenario(name="ebc_own_group", kind="ebc", tables=TABLES, use_planner=True)


def _own_group(rank: int, world_size: int, scenario: h.Scenario):
    """Every rank makes a group of each rank alone, then trains the
    scenario as the one rank of its own group."""
    groups = [dist.new_group([r]) for r in range(world_size)]
    out = h.run_scenario(0, 1, scenario, pg=groups[rank])
    dist.barrier()
    return out


def test_each_rank_shards_over_a_group_of_its_own():
    got = h.run_world(_own_group, 2, SCENARIO)
    want = h.reference_outputs(SCENARIO, 1)[0]
    for rank in range(2):
        h.assert_matches(got[rank], want)
        kernels = got[rank]["plan_kernels"]
        assert kernels["d0"] == ("row_wise", "customized_kernel", "DynamicEmbParameterSharding")
        assert kernels["d1"] == ("row_wise", "customized_kernel", "DynamicEmbParameterSharding")


# ------------------------------------------------------------------ refusals --


def _parts(world_size: int = 1, device_type: str = "cpu"):
    """(the unsharded model, a planner of ``world_size`` ranks computing on
    ``device_type``, the sharder) of the scenario."""
    collection = h.build_collection(SCENARIO, torch.device("cpu"))
    planner = h.scenario_planner(SCENARIO, collection, world_size, device_type)
    return h.ScenarioModel(collection), planner, h.sharder_for(SCENARIO)


@pytest.fixture
def world_of_one(tmp_path):
    """This process as the one rank of a gloo group."""
    dist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp_path, 'store')}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _assert_unsharded(model) -> None:
    assert isinstance(model.coll, EmbeddingBagCollection)


def test_one_rank_shards_over_the_default_group(world_of_one):
    model, planner, sharder = _parts()
    sharded, plan = plan_and_shard(model, planner, [sharder], "cpu")
    assert isinstance(sharded, DistributedModelParallel)
    entry = plan.plan["coll"]["d0"]
    assert type(entry).__name__ == "DynamicEmbParameterSharding"
    assert entry.ranks == [0]
    assert entry.dynamicemb_options.max_capacity == planner.dynamicemb_options["d0"].max_capacity


def test_without_a_process_group_it_says_to_start_one():
    assert not dist.is_initialized()
    model, planner, sharder = _parts()
    with pytest.raises(RuntimeError, match="init_process_group first, or pass pg"):
        plan_and_shard(model, planner, [sharder], "cpu")
    _assert_unsharded(model)


def test_a_planner_of_another_world_size_is_refused(world_of_one):
    model, planner, sharder = _parts(world_size=2)
    with pytest.raises(ValueError, match="topology has world size 2, the process group 1 ranks"):
        plan_and_shard(model, planner, [sharder], "cpu")
    _assert_unsharded(model)


def test_a_planner_for_another_device_is_refused(world_of_one):
    model, planner, sharder = _parts(device_type="cuda")
    with pytest.raises(ValueError, match="computes on 'cuda', the model is to be sharded on cpu"):
        plan_and_shard(model, planner, [sharder], torch.device("cpu"))
    _assert_unsharded(model)


def test_torchrecs_own_planner_is_refused(world_of_one):
    model, _, sharder = _parts()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"))
    with pytest.raises(TypeError, match="DynamicEmbeddingShardingPlanner, got EmbeddingSharding"):
        plan_and_shard(model, planner, [sharder], "cpu")
    _assert_unsharded(model)


@pytest.mark.parametrize(
    "sharders,error,message",
    [
        ("one", TypeError, "sharders must be a sequence of ModuleSharder, got"),
        ([], ValueError, "at least one ModuleSharder, got an empty sequence"),
        (["first", "x"], TypeError, r"sharders\[1\] must be a ModuleSharder, got str"),
    ],
)
def test_sharders_not_a_list_of_sharders_are_refused(world_of_one, sharders, error, message):
    model, planner, sharder = _parts()
    given = {"one": sharder, "first": sharder}
    if isinstance(sharders, str):
        sharders = given[sharders]
    else:
        sharders = [given.get(s, s) for s in sharders]
    with pytest.raises(error, match=message):
        plan_and_shard(model, planner, sharders, "cpu")
    _assert_unsharded(model)
