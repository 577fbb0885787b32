"""Tests of dynamicemb.planner against the spec's "Sharding planner" rules.

Expected capacities and bytes are worked out here from the spec's rules (and
written as numbers), not by calling the code under test.
"""

import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import ParameterSharding, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynamicemb import (
    MAX_BUCKET_CAPACITY,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
)
from dynamicemb.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    prepare_table_options,
)
from dynamicemb.planner.parameter_sharding import DynamicEmbParameterSharding

RW = ShardingType.ROW_WISE.value
CUSTOM = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
FUSED = EmbeddingComputeKernel.FUSED.value


# ------------------------------------------------------------------ sharders


def _with_dynamic_kernel(base):
    """TorchRec's sharder, offering row-wise on every device and the
    customized kernel for row-wise (what dynamicemb's sharders offer)."""

    class Sharder(base):
        def sharding_types(self, compute_device_type):
            types = super().sharding_types(compute_device_type)
            return types if RW in types else types + [RW]

        def compute_kernels(self, sharding_type, compute_device_type):
            kernels = super().compute_kernels(sharding_type, compute_device_type)
            return kernels + [CUSTOM] if sharding_type == RW else kernels

    return Sharder


def _sharders(fused_params=None):
    try:
        from dynamicemb.shard import (
            DynamicEmbeddingBagCollectionSharder,
            DynamicEmbeddingCollectionSharder,
        )

        return [
            DynamicEmbeddingCollectionSharder(fused_params=fused_params),
            DynamicEmbeddingBagCollectionSharder(fused_params=fused_params),
        ]
    except ImportError:
        return [
            _with_dynamic_kernel(EmbeddingCollectionSharder)(fused_params=fused_params),
            _with_dynamic_kernel(EmbeddingBagCollectionSharder)(fused_params=fused_params),
        ]


# --------------------------------------------------------------------- model


def _ec_configs(huge=1000):
    return [
        EmbeddingConfig(name="dyn_ec", embedding_dim=16, num_embeddings=huge, feature_names=["f0"]),
        EmbeddingConfig(
            name="static_ec", embedding_dim=16, num_embeddings=100, feature_names=["f1"]
        ),
    ]


def _ebc_configs():
    return [
        EmbeddingBagConfig(
            name="dyn_ebc", embedding_dim=8, num_embeddings=1000, feature_names=["f2"]
        ),
        EmbeddingBagConfig(
            name="static_ebc", embedding_dim=8, num_embeddings=60, feature_names=["f3"]
        ),
    ]


class _Model(torch.nn.Module):
    def __init__(self, ec_configs, ebc_configs):
        super().__init__()
        self.ec = EmbeddingCollection(tables=ec_configs, device=torch.device("meta"))
        self.ebc = EmbeddingBagCollection(tables=ebc_configs, device=torch.device("meta"))


def _constraints(**dyn_options):
    return {
        "dyn_ec": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=dyn_options.get("dyn_ec", DynamicEmbTableOptions()),
        ),
        "static_ec": ParameterConstraints(),
        "dyn_ebc": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=dyn_options.get("dyn_ebc", DynamicEmbTableOptions()),
        ),
        "static_ebc": DynamicEmbParameterConstraints(use_dynamicemb=False),
    }


def _topology(world_size, device="cpu"):
    return Topology(world_size=world_size, compute_device=device)


def _cfg(num_embeddings, dim=16):
    return EmbeddingConfig(
        name="t", embedding_dim=dim, num_embeddings=num_embeddings, feature_names=["f"]
    )


# --------------------------------------------------------- option preparation


@pytest.mark.parametrize(
    "num_embeddings, world_size, bucket, want_width, want_capacity",
    [
        # ceil(1000 / 3) = 334 rows -> 3 buckets of 128.
        (1000, 3, 128, 128, 384),
        # Sentinel: one bucket of 334 rounded up to a multiple of 16.
        (1000, 3, MAX_BUCKET_CAPACITY, 336, 336),
        (1000, 1, MAX_BUCKET_CAPACITY, 1008, 1008),
        (1024, 4, MAX_BUCKET_CAPACITY, 256, 256),
        # Fewer rows than a bucket: still one whole bucket.
        (2, 8, 128, 128, 128),
        (2, 8, MAX_BUCKET_CAPACITY, 16, 16),
        (1000, 2, 64, 64, 512),
    ],
)
def test_prepare_bucket_layout(num_embeddings, world_size, bucket, want_width, want_capacity):
    options = DynamicEmbTableOptions(bucket_capacity=bucket)
    prepared = prepare_table_options(options, _cfg(num_embeddings), world_size)
    assert prepared.bucket_capacity == want_width
    assert prepared.max_capacity == want_capacity
    assert prepared.init_capacity == want_capacity
    assert prepared.dim == 16
    assert options.bucket_capacity == bucket and options.max_capacity is None


@pytest.mark.parametrize(
    "init, want",
    [(1, 128), (200, 256), (256, 256), (384, 384), (1000, 384), (10**9, 384)],
)
def test_prepare_init_capacity_aligned_then_clamped(init, want):
    # 1000 rows over 3 ranks with buckets of 128: max_capacity 384.
    options = DynamicEmbTableOptions(bucket_capacity=128, init_capacity=init)
    assert prepare_table_options(options, _cfg(1000), 3).init_capacity == want


def test_prepare_init_capacity_with_sentinel_width():
    # One bucket of 336 per rank: 100 rounds up to the bucket, i.e. 336.
    options = DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY, init_capacity=100)
    prepared = prepare_table_options(options, _cfg(1000), 3)
    assert (prepared.bucket_capacity, prepared.max_capacity, prepared.init_capacity) == (
        336,
        336,
        336,
    )


@pytest.mark.parametrize(
    "global_bytes, world_size, want",
    [(0, 4, 0), (1000, 4, 250), (1001, 4, 251), (1001, 2, 501), (7, 1, 7)],
)
def test_prepare_local_hbm_split(global_bytes, world_size, want):
    options = DynamicEmbTableOptions(global_hbm_for_values=global_bytes)
    prepared = prepare_table_options(options, _cfg(1000), world_size)
    assert prepared.local_hbm_for_values == want
    assert prepared.global_hbm_for_values == global_bytes


def test_prepare_completes_uniform_bounds_from_the_config():
    prepared = prepare_table_options(DynamicEmbTableOptions(), _cfg(400), 2)
    assert prepared.initializer_args.mode == DynamicEmbInitializerMode.UNIFORM
    assert prepared.initializer_args.lower == pytest.approx(-0.05)
    assert prepared.initializer_args.upper == pytest.approx(0.05)
    partial = DynamicEmbTableOptions(initializer_args=DynamicEmbInitializerArgs(lower=-0.01))
    prepared = prepare_table_options(partial, _cfg(400), 2)
    assert (prepared.initializer_args.lower, prepared.initializer_args.upper) == (
        -0.01,
        pytest.approx(0.05),
    )
    assert partial.initializer_args.upper is None
    normal = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL, std_dev=0.1)
    prepared = prepare_table_options(DynamicEmbTableOptions(initializer_args=normal), _cfg(400), 2)
    assert prepared.initializer_args == normal


def test_prepare_is_idempotent_for_one_world_size():
    for bucket in (128, MAX_BUCKET_CAPACITY):
        options = DynamicEmbTableOptions(
            bucket_capacity=bucket, init_capacity=50, global_hbm_for_values=999
        )
        once = prepare_table_options(options, _cfg(1000), 3)
        assert prepare_table_options(once, _cfg(1000), 3) == once


def test_prepare_rejects_a_bucket_width_that_is_not_a_multiple_of_16():
    with pytest.raises(ValueError, match="100"):
        DynamicEmbTableOptions(bucket_capacity=100)
    options = DynamicEmbTableOptions()
    options.bucket_capacity = 100  # set after construction: the planner catches it
    with pytest.raises(ValueError, match="bucket_capacity.*100"):
        prepare_table_options(options, _cfg(1000), 2)


# ------------------------------------------------------------------ planner


def test_planner_updates_the_options_the_user_passed():
    opts = DynamicEmbTableOptions(global_hbm_for_values=4000)
    constraints = _constraints(dyn_ec=opts)
    DynamicEmbeddingShardingPlanner(
        _ec_configs(huge=500) + _ebc_configs(), topology=_topology(2), constraints=constraints
    )
    # The spec's step: the planner updates that table's DynamicEmbTableOptions.
    assert constraints["dyn_ec"].dynamicemb_options is opts
    assert (opts.dim, opts.bucket_capacity, opts.max_capacity, opts.init_capacity) == (
        16,
        128,
        256,
        256,
    )
    assert opts.local_hbm_for_values == 2000
    assert opts.initializer_args.lower == pytest.approx(-math.sqrt(1 / 500))


def test_planner_prepares_dynamic_tables_sharing_one_options_object():
    shared = DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY, global_hbm_for_values=4000)
    constraints = _constraints(dyn_ec=shared, dyn_ebc=shared)
    static_ec = constraints["static_ec"]
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs(huge=500) + _ebc_configs(), topology=_topology(2), constraints=constraints
    )
    ec_opts = constraints["dyn_ec"].dynamicemb_options
    ebc_opts = constraints["dyn_ebc"].dynamicemb_options
    # The first table's preparation updates the object; the second gets its own.
    assert ec_opts is shared and ebc_opts is not shared
    # dyn_ec: 500 rows / 2 = 250 -> 256; dyn_ebc: 1000 / 2 = 500 -> 512.
    assert (ec_opts.dim, ec_opts.bucket_capacity, ec_opts.max_capacity) == (16, 256, 256)
    assert (ebc_opts.dim, ebc_opts.bucket_capacity, ebc_opts.max_capacity) == (8, 512, 512)
    assert ec_opts.local_hbm_for_values == ebc_opts.local_hbm_for_values == 2000
    assert constraints["static_ec"] is static_ec
    assert planner.dynamicemb_options == {"dyn_ec": ec_opts, "dyn_ebc": ebc_opts}
    assert planner.constraints is constraints


def test_updated_constraints_plan_again_from_the_given_options():
    constraints = _constraints(dyn_ec=DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY))
    configs = _ec_configs(huge=1000) + _ebc_configs()
    DynamicEmbeddingShardingPlanner(configs, topology=_topology(1), constraints=constraints)
    assert constraints["dyn_ec"].dynamicemb_options.bucket_capacity == 1008
    # A second planner of another world size starts from the sentinel, not 1008.
    DynamicEmbeddingShardingPlanner(configs, topology=_topology(4), constraints=constraints)
    assert constraints["dyn_ec"].dynamicemb_options.bucket_capacity == 256
    assert constraints["dyn_ec"].dynamicemb_options.max_capacity == 256
    # Fields edited in between are what the next planner prepares.
    constraints["dyn_ec"].dynamicemb_options.bucket_capacity = 128
    DynamicEmbeddingShardingPlanner(configs, topology=_topology(2), constraints=constraints)
    assert constraints["dyn_ec"].dynamicemb_options.bucket_capacity == 128
    assert constraints["dyn_ec"].dynamicemb_options.max_capacity == 512


def _snapshot(constraints):
    return {name: (c, getattr(c, "dynamicemb_options", None)) for name, c in constraints.items()}


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda cfgs, cons: cfgs.append(_ec_configs()[0]), ValueError, "more than once.*dyn_ec"),
        (lambda cfgs, cons: cons.pop("static_ebc"), ValueError, "missing.*static_ebc"),
        (
            lambda cfgs, cons: cons.__setitem__("ghost", ParameterConstraints()),
            ValueError,
            "not in eb_configs.*ghost",
        ),
        (lambda cfgs, cons: cfgs.append("static_ec"), TypeError, "eb_configs\\[4\\]"),
        (
            lambda cfgs, cons: cons.__setitem__("static_ec", {"sharding_types": []}),
            TypeError,
            "static_ec",
        ),
        (
            lambda cfgs, cons: setattr(cons["dyn_ebc"], "sharding_types", ["table_wise"]),
            ValueError,
            "dyn_ebc.*table_wise",
        ),
        (
            lambda cfgs, cons: setattr(cons["dyn_ebc"], "compute_kernels", ["fused"]),
            ValueError,
            "dyn_ebc.*fused",
        ),
        (
            lambda cfgs, cons: setattr(cons["dyn_ebc"].dynamicemb_options, "bucket_capacity", 24),
            ValueError,
            "dyn_ebc.*24",
        ),
    ],
)
def test_planner_validation_errors_name_the_table_and_change_nothing(mutate, error, match):
    configs = _ec_configs() + _ebc_configs()
    constraints = _constraints()
    mutate(configs, constraints)
    before = _snapshot(constraints)
    with pytest.raises(error, match=match):
        DynamicEmbeddingShardingPlanner(configs, topology=_topology(2), constraints=constraints)
    after = _snapshot(constraints)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name][0] is before[name][0] and after[name][1] is before[name][1]


def test_planner_needs_a_dynamic_enumerator_for_dynamic_tables():
    topology = _topology(2)
    with pytest.raises(TypeError, match="DynamicEmbeddingEnumerator"):
        DynamicEmbeddingShardingPlanner(
            _ec_configs() + _ebc_configs(),
            topology=topology,
            enumerator=EmbeddingEnumerator(topology=topology, batch_size=512),
            constraints=_constraints(),
        )


def test_planner_default_topology_without_a_process_group():
    assert not dist.is_initialized()
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs() + _ebc_configs(), constraints=_constraints()
    )
    assert planner.topology.world_size == 1
    assert planner.topology.compute_device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert planner.dynamicemb_options["dyn_ebc"].max_capacity == 1024  # 1000 -> 8 buckets of 128


def _expected_dynamic(world_size, num_embeddings, dim, bucket=128):
    rows = math.ceil(num_embeddings / world_size)
    capacity = max(1, math.ceil(rows / bucket)) * bucket
    return capacity


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_plan_mixed_model(world_size):
    options = {
        "dyn_ec": DynamicEmbTableOptions(
            init_capacity=100, global_hbm_for_values=10_000, dist_type="hash_roundrobin"
        ),
        "dyn_ebc": DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY),
    }
    constraints = _constraints(**options)
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs() + _ebc_configs(),
        topology=_topology(world_size),
        constraints=constraints,
        debug=False,
    )
    plan = planner.plan(_Model(_ec_configs(), _ebc_configs()), _sharders())
    assert set(plan.plan) == {"ec", "ebc"}
    dyn_ec = plan.plan["ec"]["dyn_ec"]
    dyn_ebc = plan.plan["ebc"]["dyn_ebc"]
    for entry in (dyn_ec, dyn_ebc):
        assert isinstance(entry, DynamicEmbParameterSharding)
        assert entry.sharding_type == RW and entry.compute_kernel == CUSTOM
        assert entry.ranks == list(range(world_size))
        assert sum(s.shard_sizes[0] for s in entry.sharding_spec.shards) == 1000
    ec_capacity = _expected_dynamic(world_size, 1000, 16)
    o = dyn_ec.dynamicemb_options
    assert (o.dim, o.bucket_capacity, o.max_capacity) == (16, 128, ec_capacity)
    assert o.init_capacity == 128  # 100 -> one bucket
    assert o.local_hbm_for_values == math.ceil(10_000 / world_size)
    assert o.dist_type == "hash_roundrobin"
    assert o.initializer_args.lower == pytest.approx(-math.sqrt(1 / 1000))
    assert o.initializer_args.upper == pytest.approx(math.sqrt(1 / 1000))
    o = dyn_ebc.dynamicemb_options
    width = math.ceil(math.ceil(1000 / world_size) / 16) * 16
    assert (o.dim, o.bucket_capacity, o.max_capacity, o.init_capacity) == (8, width, width, width)
    assert o.dist_type == "roundrobin"
    assert o is constraints["dyn_ebc"].dynamicemb_options
    for module, name in (("ec", "static_ec"), ("ebc", "static_ebc")):
        entry = plan.plan[module][name]
        assert type(entry) is ParameterSharding
        assert entry.compute_kernel != CUSTOM


@pytest.mark.parametrize("world_size", [2, 4])
def test_plan_huge_dynamic_table(world_size):
    huge = 2**40
    constraints = _constraints(
        dyn_ec=DynamicEmbTableOptions(init_capacity=4096, global_hbm_for_values=2**20)
    )
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs(huge=huge) + _ebc_configs(),
        topology=_topology(world_size, "cuda"),
        constraints=constraints,
        debug=False,
    )
    plan = planner.plan(_Model(_ec_configs(huge=huge), _ebc_configs()), _sharders())
    entry = plan.plan["ec"]["dyn_ec"]
    assert isinstance(entry, DynamicEmbParameterSharding)
    assert entry.dynamicemb_options.max_capacity == huge // world_size
    assert entry.dynamicemb_options.init_capacity == 4096
    assert sum(s.shard_sizes[0] for s in entry.sharding_spec.shards) == huge


def test_plan_leaves_the_dynamic_tables_allocation_to_its_options():
    # Without init_capacity the table is built at max_capacity (2**39 rows of
    # keys and scores per rank): the topology does not budget it.
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs(huge=2**40) + _ebc_configs(),
        topology=_topology(2, "cuda"),
        constraints=_constraints(),
        debug=False,
    )
    plan = planner.plan(_Model(_ec_configs(huge=2**40), _ebc_configs()), _sharders())
    assert plan.plan["ec"]["dyn_ec"].dynamicemb_options.init_capacity == 2**39


def test_plan_rejects_a_sharder_without_the_dynamic_kernel():
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs() + _ebc_configs(),
        topology=_topology(2),
        constraints=_constraints(),
        debug=False,
    )
    sharders = [
        _with_dynamic_kernel(EmbeddingCollectionSharder)(),
        EmbeddingBagCollectionSharder(),
    ]
    with pytest.raises(ValueError, match="dyn_ebc"):
        planner.plan(_Model(_ec_configs(), _ebc_configs()), sharders)


def test_plan_rejects_a_model_that_disagrees_with_eb_configs():
    configs = _ec_configs() + _ebc_configs()
    planner = DynamicEmbeddingShardingPlanner(
        configs, topology=_topology(2), constraints=_constraints(), debug=False
    )
    model_configs = _ec_configs(huge=2000)
    with pytest.raises(ValueError, match="dyn_ec.*2000"):
        planner.plan(_Model(model_configs, _ebc_configs()), _sharders())


def test_plan_rejects_an_optimizer_dynamicemb_lacks():
    planner = DynamicEmbeddingShardingPlanner(
        _ec_configs() + _ebc_configs(),
        topology=_topology(2),
        constraints=_constraints(),
        debug=False,
    )
    with pytest.raises(ValueError, match="dyn_ebc?.*LAMB"):
        planner.plan(
            _Model(_ec_configs(), _ebc_configs()), _sharders({"optimizer": EmbOptimType.LAMB})
        )


def test_collective_plan_single_rank_group():
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1
        )
        try:
            planner = DynamicEmbeddingShardingPlanner(
                _ec_configs() + _ebc_configs(), constraints=_constraints(), debug=False
            )
            assert planner.topology.world_size == 1
            plan = planner.collective_plan(_Model(_ec_configs(), _ebc_configs()), _sharders())
        finally:
            dist.destroy_process_group()
    entry = plan.plan["ebc"]["dyn_ebc"]
    assert isinstance(entry, DynamicEmbParameterSharding)
    assert entry.dynamicemb_options.max_capacity == 1024


# --------------------------------------------------------------- enumerator


def _options_by(search_space):
    out = {}
    for so in search_space:
        out.setdefault(so.name, []).append(so)
    return out


def test_enumerator_static_tables_as_torchrec():
    topology = _topology(4, "cuda")
    constraints = _constraints()
    model = _Model(_ec_configs(), _ebc_configs())
    ours = _options_by(
        DynamicEmbeddingEnumerator(topology, constraints=constraints).enumerate(model, _sharders())
    )
    theirs = _options_by(
        EmbeddingEnumerator(topology, batch_size=512, constraints=constraints).enumerate(
            model, [EmbeddingCollectionSharder(), EmbeddingBagCollectionSharder()]
        )
    )
    # TorchRec's EBC sharder has no row-wise on the CPU only; on CUDA both agree.
    for name in ("static_ec", "static_ebc"):
        key = lambda so: (so.sharding_type, so.compute_kernel)  # noqa: E731
        a = sorted(ours[name], key=key)
        b = sorted(theirs[name], key=key)
        assert [key(so) for so in a] == [key(so) for so in b]
        for x, y in zip(a, b):
            assert [s.size for s in x.shards] == [s.size for s in y.shards]
            assert [s.storage for s in x.shards] == [s.storage for s in y.shards]
            assert [s.perf for s in x.shards] == [s.perf for s in y.shards]
    for name in ("dyn_ec", "dyn_ebc"):
        assert [(so.sharding_type, so.compute_kernel) for so in ours[name]] == [(RW, CUSTOM)]


def _rw_fused(options):
    return next(so for so in options if so.sharding_type == RW and so.compute_kernel == FUSED)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("caching", [False, True])
def test_enumerator_dynamic_storage(device, caching):
    # A dynamic table and a static one of the same shape and inputs: the
    # static FUSED row-wise option's storage minus its dense rows is the
    # input/output part both share, and all the dynamic option's storage (the
    # table itself is outside the topology's budget).
    world_size, dim, rows = 2, 16, 1000
    configs = [
        EmbeddingBagConfig(name="dyn", embedding_dim=dim, num_embeddings=rows, feature_names=["a"]),
        EmbeddingBagConfig(
            name="twin", embedding_dim=dim, num_embeddings=rows, feature_names=["b"]
        ),
    ]
    model = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    options = DynamicEmbTableOptions(
        init_capacity=300, global_hbm_for_values=30_000, caching=caching
    )
    constraints = {
        "dyn": DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options),
        "twin": ParameterConstraints(),
    }
    enumerator = DynamicEmbeddingEnumerator(_topology(world_size, device), constraints=constraints)
    sharders = [_sharders({"optimizer": EmbOptimType.ADAM})[1]]
    space = _options_by(enumerator.enumerate(model, sharders))
    (dyn,) = space["dyn"]
    twin = _rw_fused(space["twin"])
    dense_rows = [s.size[0] * dim * 4 for s in twin.shards]
    for shard, twin_shard, dense in zip(dyn.shards, twin.shards, dense_rows):
        assert shard.perf == twin_shard.perf
        if device == "cuda":
            io = twin_shard.storage.hbm - dense
            assert twin_shard.storage.ddr == 0
            assert (shard.storage.hbm, shard.storage.ddr) == (io, 0)
        else:
            io = twin_shard.storage.ddr - dense
            assert twin_shard.storage.hbm == 0
            assert (shard.storage.hbm, shard.storage.ddr) == (0, io)
        assert io > 0


def test_enumerator_prepares_for_its_own_world_size():
    # Constraints a world-size-1 planner updated (sentinel width 1008) are
    # prepared from the sentinel again by an enumerator of world size 4.
    constraints = _constraints(dyn_ec=DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY))
    DynamicEmbeddingShardingPlanner(
        _ec_configs() + _ebc_configs(), topology=_topology(1), constraints=constraints
    )
    assert constraints["dyn_ec"].dynamicemb_options.bucket_capacity == 1008
    enumerator = DynamicEmbeddingEnumerator(_topology(4), constraints=constraints)
    space = _options_by(enumerator.enumerate(_Model(_ec_configs(), _ebc_configs()), _sharders()))
    prepared = enumerator.prepared_options(space["dyn_ec"][0])
    assert (prepared.bucket_capacity, prepared.max_capacity) == (256, 256)


def test_prepare_warns_of_a_dim_that_differs_from_the_config_and_uses_the_config():
    options = DynamicEmbTableOptions(dim=8)
    with pytest.warns(UserWarning, match=r"table 't'.*dim \(8\) differs.*embedding_dim \(16\)"):
        prepared = prepare_table_options(options, _cfg(1000), 2)
    assert prepared.dim == 16
    assert options.dim == 8 and options.max_capacity is None


def test_the_planner_sets_dim_from_the_config():
    constraints = _constraints(dyn_ec=DynamicEmbTableOptions(dim=4))
    with pytest.warns(UserWarning, match=r"table 'dyn_ec'.*dim \(4\)"):
        planner = DynamicEmbeddingShardingPlanner(
            _ec_configs() + _ebc_configs(), topology=_topology(2), constraints=constraints
        )
    plan = planner.plan(_Model(_ec_configs(), _ebc_configs()), _sharders())
    assert plan.plan["ec"]["dyn_ec"].dynamicemb_options.dim == 16


def test_the_planner_spells_the_preparation_by_the_specs_name_too():
    from dynamicemb.planner.planner import _prepare_dynemb_table_options

    assert _prepare_dynemb_table_options is prepare_table_options


def test_prepare_keeps_a_per_rank_budget_given_without_a_global_one():
    # A plan written by hand names the per-rank budget; the sharders prepare
    # its options again and must not zero it.
    options = DynamicEmbTableOptions(local_hbm_for_values=4096)
    assert prepare_table_options(options, _cfg(1000), 2).local_hbm_for_values == 4096
    both = DynamicEmbTableOptions(local_hbm_for_values=4096, global_hbm_for_values=1000)
    assert prepare_table_options(both, _cfg(1000), 2).local_hbm_for_values == 500


def test_a_table_rounded_up_says_so_once_with_name_asked_and_got(caplog):
    import logging
    import warnings

    from dynamicemb.planner.prepare import prepare_table_options

    options = DynamicEmbTableOptions()
    # 1000 rows over 3 ranks: 334 a rank, whole buckets of 128 make 384 (1152 in all).
    small = EmbeddingConfig(name="small_t", num_embeddings=1000, embedding_dim=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # the planner and each sharder prepare it again
            prepare_table_options(options, small, 3)
    said = [str(w.message) for w in caught if "small_t" in str(w.message)]
    assert len(said) == 1, said
    assert "num_embeddings=1000 gives 1152 rows (384 per rank on 3 ranks" in said[0]
    assert "bucket_capacity=128" in said[0] and "num_embeddings=1152" in said[0]
    # A large table's last partial bucket (64 of 1,000,000 rows): logged, not warned.
    large = EmbeddingConfig(name="large_t", num_embeddings=1_000_000, embedding_dim=4)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        prepare_table_options(options, large, 1)
        prepare_table_options(options, large, 1)
    assert not [w for w in caught if "large_t" in str(w.message)]
    logged = [r.getMessage() for r in caplog.records if "large_t" in r.getMessage()]
    assert len(logged) == 1 and "gives 1000064 rows" in logged[0], logged
    # Asked for what it holds: nothing said.
    exact = EmbeddingConfig(name="exact_t", num_embeddings=1152, embedding_dim=4)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        prepare_table_options(options, exact, 3)
    assert not [w for w in caught if "exact_t" in str(w.message)]
    assert not [r for r in caplog.records if "exact_t" in r.getMessage()]


def test_torchrec_planner_with_dynamic_tables_is_refused_naming_ours():
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from dynamicemb.shard import DynamicEmbeddingCollectionSharder

    model = _Model(_ec_configs(), _ebc_configs())
    theirs = EmbeddingShardingPlanner(topology=_topology(2), constraints=_constraints())
    with pytest.raises(ValueError, match="planned by dynamicemb.planner.DynamicEmbeddingSharding"):
        theirs.plan(model, _sharders())
    # The same sharders asked directly, or by our planner, answer.
    kernels = DynamicEmbeddingCollectionSharder().compute_kernels("row_wise", "cpu")
    assert CUSTOM in kernels
    ours = DynamicEmbeddingShardingPlanner(
        eb_configs=_ec_configs() + _ebc_configs(), topology=_topology(2), constraints=_constraints()
    )
    plan = ours.plan(model, _sharders())
    assert plan.plan["ec"]["dyn_ec"].compute_kernel == CUSTOM
