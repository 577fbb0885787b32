"""Admission under DistributedModelParallel (gloo on the CPU, world sizes 1
and 2; NCCL on every visible GPU under the `multigpu` marker), against the
dense float64 reference of tests/shard/shard_harness.py, which admits a key
in the step its count over all ranks' batches reaches the threshold.

Tables with equal strategies built apart share one fused module; a table
with another threshold gets a module of its own.
"""

import pytest
import torch

from tests.shard import shard_harness as h

T = h.TableSpec


def _scenarios():
    return [
        h.Scenario(
            name="ec_admission",
            kind="ec",
            tables=[
                T("t0", 40, 4, dist_type="roundrobin", admit_threshold=2),
                T("t1", 40, 4, dist_type="hash_roundrobin", admit_threshold=2),
                T("t2", 40, 4, dist_type="continuous", admit_threshold=3),
                T("t3", 40, 4, dist_type="roundrobin"),
            ],
            steps=6,
            key_range=(0, 24),
        ),
        h.Scenario(
            name="ebc_admission",
            kind="ebc",
            tables=[
                T("t0", 40, 4, pooling="SUM", admit_threshold=2, initializer="uniform"),
                T("t1", 40, 2, pooling="MEAN", admit_threshold=1),
            ],
            steps=5,
            key_range=(0, 20),
        ),
    ]


SCENARIOS = _scenarios()


@pytest.fixture(scope="module")
def runs():
    cache = {}

    def get(world_size, device_type="cpu"):
        if (world_size, device_type) not in cache:
            cache[(world_size, device_type)] = h.run_world(
                h.run_scenarios, world_size, SCENARIOS, device_type=device_type
            )
        return cache[(world_size, device_type)]

    return get


def _check(got, scenario, world_size):
    want = h.reference_outputs(scenario, world_size)
    for rank in range(world_size):
        h.assert_matches(got[rank][scenario.name], want[rank])
    # Per-table counts, summed over the ranks, are the reference's.
    for name, (admitted, rejected) in want[0]["admission"].items():
        total = sum(got[r][scenario.name]["admission"]["counts"][name] for r in range(world_size))
        assert total.tolist() == [admitted, rejected], name
        assert rejected > 0 and admitted > 0 or scenario.name == "ebc_admission"


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_sharded_admission_matches_the_reference(runs, world_size, name):
    scenario = next(s for s in SCENARIOS if s.name == name)
    _check(runs(world_size), scenario, world_size)


@pytest.mark.parametrize("world_size", [1, 2])
def test_equal_strategies_share_a_module_and_other_thresholds_split(runs, world_size):
    for rank in range(world_size):
        modules = runs(world_size)[rank]["ec_admission"]["admission"]["modules"]
        assert modules == [(("t0", "t1"), 2), (("t2",), 3)]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.multigpu
@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_nccl_sharded_admission_matches_the_reference(runs, name):
    world = max(2, _gpus())
    scenario = next(s for s in SCENARIOS if s.name == name)
    _check(runs(world, "cuda"), scenario, world)
