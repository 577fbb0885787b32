"""Sharded training with the dynamicemb sharders against a dense float64 model.

Each world size runs once (gloo on the CPU, one process per rank) and trains
every scenario of that world; the scenarios' local outputs of each step (and
of a final eval step) are compared with a single-process float64 model whose
rows start from the same key-derived initializer.

The `multigpu` cases run the world-2 scenarios (every dist type, EC and EBC,
dedup on and off, static tables, the planner) once more with NCCL, one
process per visible GPU, against the same reference at that world size.
"""

import pytest
import torch

from tests.shard import shard_harness as h

T = h.TableSpec
DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")


def _ec(name, dist_type, **kw):
    tables = [T("t0", 40, 4, dist_type=dist_type), T("t1", 24, 4, dist_type=dist_type)]
    return h.Scenario(name=name, kind="ec", tables=tables, **kw)


def _ebc(name, dist_type, **kw):
    tables = [
        T("t0", 40, 4, dist_type=dist_type, pooling="SUM"),
        T("t1", 24, 3, dist_type=dist_type, pooling="MEAN"),
    ]
    return h.Scenario(name=name, kind="ebc", tables=tables, **kw)


def _ec_uniform_init(dist_type0, dist_type1):
    # Key-derived random initializer; the dist types differ between worlds.
    tables = [
        T("t0", 40, 4, dist_type=dist_type0, initializer="uniform"),
        T("t1", 40, 4, dist_type=dist_type1, initializer="uniform"),
    ]
    return h.Scenario(name="ec_uniform_init", kind="ec", tables=tables)


def _world2_scenarios():
    out = []
    for d in DIST_TYPES:
        out.append(_ec(f"ec_{d}", d))
        out.append(_ebc(f"ebc_{d}", d))
    out += [
        _ec("ec_adam", "roundrobin", optimizer="adam", learning_rate=0.05),
        _ebc("ebc_adam", "hash_roundrobin", optimizer="adam", learning_rate=0.05),
        # Row-wise RMSprop AR: rows skip steps, so the step each rank's module
        # counts reaches every row's update.
        _ec("ec_rmsprop_ar", "roundrobin", optimizer="rmsprop_ar", learning_rate=0.2, steps=6),
        _ebc("ebc_rmsprop_ar", "hash_roundrobin", optimizer="rmsprop_ar", learning_rate=0.2),
        # Dedup on and off, with and without KJT weights (frequency counters).
        _ec("ec_dedup", "hash_roundrobin", use_index_dedup=True),
        _ec("ec_nodedup_counts", "continuous", seq_weights=True),
        _ec("ec_dedup_counts", "continuous", seq_weights=True, use_index_dedup=True),
        _ec(
            "ec_dedup_adam",
            "roundrobin",
            use_index_dedup=True,
            optimizer="adam",
            learning_rate=0.05,
        ),
        # Weighted SUM; and an unweighted collection that ignores KJT weights.
        h.Scenario(
            name="ebc_weighted",
            kind="ebc",
            tables=[
                T("t0", 40, 4, dist_type="roundrobin"),
                T("t1", 24, 2, dist_type="hash_roundrobin"),
            ],
            weighted=True,
        ),
        h.Scenario(
            name="ebc_unweighted_kjt_weights",
            kind="ebc",
            tables=[T("t0", 40, 4, dist_type="roundrobin")],
            seq_weights=True,
        ),
        # Static TorchRec tables (row-wise and table-wise, FUSED) next to dynamic ones.
        h.Scenario(
            name="ec_mixed",
            kind="ec",
            tables=[
                T("s0", 30, 4, dynamic=False, static_sharding="row_wise"),
                T("d0", 40, 4, dist_type="hash_roundrobin"),
                T("s1", 20, 4, dynamic=False, static_sharding="table_wise"),
            ],
        ),
        h.Scenario(
            name="ec_mixed_dedup",
            kind="ec",
            tables=[
                T("s0", 30, 4, dynamic=False, static_sharding="row_wise"),
                T("d0", 40, 4, dist_type="roundrobin"),
            ],
            use_index_dedup=True,
        ),
        # Through DynamicEmbeddingShardingPlanner instead of a hand-made plan.
        h.Scenario(
            name="ec_planner_mixed",
            kind="ec",
            tables=[
                T("s0", 30, 4, dynamic=False, static_sharding="table_wise"),
                T("d0", 40, 4, dist_type="hash_roundrobin"),
            ],
            use_planner=True,
            use_index_dedup=True,
        ),
        h.Scenario(
            name="ebc_planner",
            kind="ebc",
            tables=[T("d0", 40, 4, dist_type="continuous"), T("d1", 30, 2, pooling="MEAN")],
            use_planner=True,
        ),
        # Key-derived random initializer, dist types differing per table.
        _ec_uniform_init("continuous", "hash_roundrobin"),
    ]
    return out


def _world4_scenarios():
    return [
        _ec("ec_roundrobin_dedup", "roundrobin", use_index_dedup=True),
        _ec("ec_continuous", "continuous", optimizer="adam", learning_rate=0.05),
        _ebc("ebc_hash_roundrobin", "hash_roundrobin"),
        _ec_uniform_init("roundrobin", "roundrobin"),
    ]


def _world1_scenarios():
    return [
        _ec("ec_hash_roundrobin", "hash_roundrobin", use_index_dedup=True),
        _ebc("ebc_continuous", "continuous", weighted=False),
        _ec_uniform_init("hash_roundrobin", "continuous"),
    ]


SCENARIOS = {1: _world1_scenarios(), 2: _world2_scenarios(), 4: _world4_scenarios()}


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# The NCCL run: one rank per visible GPU (at least 2; the cases skip below 2).
GPU_WORLD = max(2, _gpus())
GPU_SCENARIOS = _world2_scenarios()


def _assert_scenario_matches(got, scenario, world_size):
    """Each rank's outputs equal the dense reference's; dynamic tables are
    planned row-wise with the customized kernel, static ones by TorchRec."""
    want = h.reference_outputs(scenario, world_size)
    for rank in range(world_size):
        h.assert_matches(got[rank][scenario.name], want[rank])
    kernels = got[0][scenario.name]["plan_kernels"]
    for t in scenario.tables:
        if t.dynamic:
            assert kernels[t.name] == (
                "row_wise",
                "customized_kernel",
                "DynamicEmbParameterSharding",
            )
        else:
            assert kernels[t.name][2] == "ParameterSharding"


def _assert_dedup_matches_nodedup(got, world_size, tol):
    for rank in range(world_size):
        a, b = got[rank]["ec_nodedup_counts"], got[rank]["ec_dedup_counts"]
        for step_a, step_b in zip(a["steps"] + [a["eval"]], b["steps"] + [b["eval"]]):
            for k in step_a:
                torch.testing.assert_close(step_a[k], step_b[k], rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def runs():
    cache = {}

    def get(world_size):
        if world_size not in cache:
            cache[world_size] = h.run_world(h.run_scenarios, world_size, SCENARIOS[world_size])
        return cache[world_size]

    return get


def _cases():
    return [(w, s.name) for w, scenarios in SCENARIOS.items() for s in scenarios]


@pytest.mark.parametrize("world_size,name", _cases())
def test_sharded_training_matches_dense_reference(runs, world_size, name):
    scenario = next(s for s in SCENARIOS[world_size] if s.name == name)
    _assert_scenario_matches(runs(world_size), scenario, world_size)


@pytest.fixture(scope="module")
def gpu_runs():
    return h.run_world(h.run_scenarios, GPU_WORLD, GPU_SCENARIOS, device_type="cuda")


@pytest.mark.multigpu
@pytest.mark.parametrize("name", [s.name for s in GPU_SCENARIOS])
def test_nccl_sharded_training_matches_dense_reference(gpu_runs, name):
    scenario = next(s for s in GPU_SCENARIOS if s.name == name)
    _assert_scenario_matches(gpu_runs, scenario, GPU_WORLD)


@pytest.mark.multigpu
def test_nccl_dedup_gives_the_results_without_dedup(gpu_runs):
    _assert_dedup_matches_nodedup(gpu_runs, GPU_WORLD, tol=1e-6)


def test_dedup_gives_the_results_without_dedup(runs):
    _assert_dedup_matches_nodedup(runs(2), 2, tol=0)


def test_initial_rows_do_not_depend_on_world_size_or_dist_type(runs):
    """Rank 0's first-step batch is the same in every world; with a key-derived
    initializer its embeddings are the same whatever the world size and the
    tables' dist types (which differ between the three runs)."""
    first = [runs(w)[0]["ec_uniform_init"]["steps"][0] for w in (1, 2, 4)]
    assert any(v.numel() for v in first[0].values())
    for other in first[1:]:
        for k in first[0]:
            torch.testing.assert_close(other[k], first[0][k], rtol=0, atol=0)
