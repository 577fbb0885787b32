"""A device cache trained through TorchRec's ``PrefetchTrainPipelineSparseDist``
(batch i + 1 prefetched on the pipeline's stream while batch i trains) gives
every step's outputs and every row bit for bit as the same model trained
without prefetch, and the prefetch brought keys in."""

import pytest
import torch

from tests.shard.shard_harness import run_world
from tests.storage.pipeline_cases import train_both

DEVICE_TYPES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", marks=pytest.mark.gpu, id="cuda"),
]


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_prefetch_pipeline_trains_like_the_plain_loop(optimizer, device_type):
    (res,) = run_world(train_both, 1, optimizer, 16, device_type=device_type)
    if "skip" in res:
        pytest.skip(res["skip"])
    (plain_steps, plain_rows, plain_prefetched) = res["plain"]
    (piped_steps, piped_rows, piped_prefetched) = res["pipeline"]
    assert plain_prefetched == 0 and piped_prefetched > 0
    assert len(piped_steps) == len(plain_steps) == 16
    for i, (a, b) in enumerate(zip(piped_steps, plain_steps)):
        assert torch.equal(a, b), i
    assert piped_rows.keys() == plain_rows.keys()
    for name, (fa, ea, sa) in piped_rows.items():
        fb, eb, sb = plain_rows[name]
        assert bool(fa.all()) and bool(fb.all()), name
        assert torch.equal(ea, eb) and torch.equal(sa, sb), name
