"""Storage modes under DistributedModelParallel, at world sizes 1 and 2 on
the CPU (gloo) and on every GPU (NCCL, `multigpu`): 20 steps of SGD and Adam
over far more keys than the device cache holds, each mode's outputs equal to
the all-device module's, with the cache prefetched through TorchRec's
prefetch hook between the forward and the backward."""

import pytest
import torch

from tests.shard.shard_harness import run_world
from tests.storage.sharded_cases import run_modes

MODES = ["device", "hybrid", "cache", "cache_prefetch", "external_cache"]


def _check(results, kind):
    for rank_result in results:
        device_runs = {o: rank_result[f"device-{o}"][0] for o in ("sgd", "adam")}
        for name, (steps, counts) in rank_result.items():
            want = device_runs[name.rsplit("-", 1)[1]]
            # The prefetch hook reached the caches and brought keys in.
            assert (counts["prefetched"] > 0) == name.startswith("cache_prefetch"), name
            assert len(steps) == len(want) == 20
            for i, (got_step, want_step) in enumerate(zip(steps, want)):
                for k in want_step:
                    assert torch.equal(got_step[k], want_step[k]), (kind, name, i, k)


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("kind", ["ec", "ebc"])
def test_modes_train_like_the_all_device_tables_on_gloo(world_size, kind):
    _check(run_world(run_modes, world_size, kind, MODES, 20), kind)


@pytest.mark.multigpu
def test_modes_train_like_the_all_device_tables_on_nccl():
    world = torch.cuda.device_count()
    _check(run_world(run_modes, world, "ec", MODES, 20, device_type="cuda"), "ec")
