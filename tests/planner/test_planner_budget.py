"""The planner's memory budget, as the spec's planner section states it: "The
memory budget does not include the consumption of dynamicemb." The topology
budgets TorchRec's tables; a dynamic table takes its budget from its own
options (``global_hbm_for_values``).
"""

import math

import pytest
import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.planner.planners import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection

from dynamicemb import DynamicEmbTableOptions, get_table_value_bytes
from dynamicemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynamicemb.shard import DynamicEmbeddingCollectionSharder

MiB = 1 << 20
WORLD_SIZE = 2
DIM = 16
# 10**6 rows of 16 float32: 32 MiB of values on each of the two ranks, all of
# them on the device with a budget of the whole table.
DYNAMIC_ROWS = 10**6


def _dynamic_config():
    return EmbeddingConfig(
        name="dyn", embedding_dim=DIM, num_embeddings=DYNAMIC_ROWS, feature_names=["f_dyn"]
    )


def _static_configs(rows):
    return [
        EmbeddingConfig(
            name=f"static{i}", embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f{i}"]
        )
        for i in range(2)
    ]


def _model(configs):
    return EmbeddingCollection(tables=configs, device=torch.device("meta"))


def _topology(hbm, ddr=None):
    kwargs = {} if ddr is None else {"ddr_cap": ddr}
    return Topology(world_size=WORLD_SIZE, compute_device="cuda", hbm_cap=hbm, **kwargs)


def _plan(static_rows, hbm, ddr=None):
    configs = [_dynamic_config()] + _static_configs(static_rows)
    budget = get_table_value_bytes(_dynamic_config(), None, WORLD_SIZE)
    constraints = {
        "dyn": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(global_hbm_for_values=budget),
        ),
        **{c.name: ParameterConstraints() for c in configs[1:]},
    }
    planner = DynamicEmbeddingShardingPlanner(
        configs, topology=_topology(hbm, ddr), constraints=constraints, debug=False
    )
    return planner.plan(_model(configs), [DynamicEmbeddingCollectionSharder()]), budget


def _torchrec_plan(static_rows, hbm, ddr=None):
    configs = _static_configs(static_rows)
    planner = EmbeddingShardingPlanner(topology=_topology(hbm, ddr), debug=False)
    return planner.plan(_model(configs), [EmbeddingCollectionSharder()])


def _placement(entry):
    return (entry.sharding_type, entry.compute_kernel, entry.ranks)


def test_a_topology_smaller_than_the_dynamic_tables_plans():
    # 4 MiB of HBM per rank, an eighth of what the dynamic table keeps on the
    # device of each rank.
    hbm = 4 * MiB
    plan, budget = _plan(static_rows=1000, hbm=hbm)
    assert budget / WORLD_SIZE > 7 * hbm
    entry = plan.plan[""]["dyn"]
    assert entry.dynamicemb_options.global_hbm_for_values == budget
    assert entry.dynamicemb_options.local_hbm_for_values == math.ceil(budget / WORLD_SIZE)
    assert entry.ranks == list(range(WORLD_SIZE))
    # The static tables are placed as TorchRec places them without the
    # dynamic table.
    theirs = _torchrec_plan(static_rows=1000, hbm=hbm).plan[""]
    for name in ("static0", "static1"):
        assert _placement(plan.plan[""][name]) == _placement(theirs[name])


def test_the_static_tables_are_budgeted_as_torchrec_budgets_them():
    # Two static tables of 10**6 x 16 float32 (61 MiB each) where each rank
    # has 16 MiB of HBM and 16 MiB of host memory: TorchRec refuses them, and
    # so does the planner of a model that also has a dynamic table.
    hbm = ddr = 16 * MiB
    with pytest.raises(PlannerError):
        _torchrec_plan(static_rows=10**6, hbm=hbm, ddr=ddr)
    with pytest.raises(PlannerError, match="insufficient"):
        _plan(static_rows=10**6, hbm=hbm, ddr=ddr)
