"""Storage modes under DistributedModelParallel (run in the worker processes
of tests/shard/shard_harness.py).

One worker trains the same sharded model once per (mode, optimizer) and
returns every step's local outputs; the test compares each mode's with the
all-device run's. With ``prefetch``, batch i + 1 goes through the sharded
collection's input dist and prefetch hook between the forward and the
backward of batch i, as TorchRec's ``TrainPipelinePrefetch`` calls them.
"""

import torch

from tests.shard import shard_harness as h
from tests.storage.py_dict_storage import PyDictStorage

DIM = 8
NUM_EMBEDDINGS = 8192  # rows of each table over all ranks: it never evicts
CACHE_ROWS = 32  # per rank and table: far fewer than the keys seen


def storage_options(mode: str, optimizer: str) -> dict:
    """The DynamicEmbTableOptions fields of a storage mode."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb.dynamicemb_config import value_row_bytes

    opt = EmbOptimType.EXACT_SGD if optimizer == "sgd" else EmbOptimType.ADAM
    rb = value_row_bytes(opt, DIM, torch.float32)
    return {
        "device": dict(local_hbm_for_values=NUM_EMBEDDINGS * rb),
        "hybrid": dict(local_hbm_for_values=NUM_EMBEDDINGS * rb // 4),
        "host": dict(local_hbm_for_values=0),
        "cache": dict(caching=True, local_hbm_for_values=CACHE_ROWS * rb),
        "cache_prefetch": dict(caching=True, local_hbm_for_values=CACHE_ROWS * rb),
        "external_cache": dict(
            caching=True, local_hbm_for_values=CACHE_ROWS * rb, external_storage=PyDictStorage
        ),
    }[mode]


def scenario(kind: str, mode: str, optimizer: str, steps: int) -> h.Scenario:
    tables = [
        h.TableSpec(
            name=name,
            num_embeddings=NUM_EMBEDDINGS,
            dim=DIM,
            initializer="uniform",
            options=storage_options(mode, optimizer),
        )
        for name in ("a", "b")
    ]
    return h.Scenario(
        name=f"{mode}-{optimizer}",
        kind=kind,
        tables=tables,
        optimizer=optimizer,
        learning_rate=0.05,
        steps=steps,
        batch_size=8,
        max_length=6,
        key_range=(0, 3000),
        eval_step=False,
    )


def train(rank: int, world_size: int, sc: h.Scenario, prefetch: bool) -> list:
    """The scenario's steps (shard_harness.run_scenario), with the next batch
    prefetched through the sharded collection's hook when ``prefetch``; and
    the keys the caches staged and prefetched."""
    from dynamicemb.shard.lookup import dynamic_embedding_kernels

    counts = {"overflows": 0, "prefetched": 0}

    def before_backward(model, step):
        if prefetch and step + 1 < sc.steps:
            sharded = model.module.coll
            ctx = sharded.create_context()
            nxt = h.to_kjt(sc, h.batch_for(sc, step + 1, rank)).to(h.worker_device())
            dist_input = sharded.input_dist(ctx, nxt).wait().wait()
            sharded.prefetch(dist_input=dist_input, forward_stream=None, ctx=ctx)
        if step + 1 == sc.steps:
            for kernel in dynamic_embedding_kernels(model):
                for name in counts:
                    counts[name] += int(getattr(kernel.emb_module.storage, name, 0))

    result = h.run_scenario(rank, world_size, sc, before_backward)
    return [result["steps"], counts]


def run_modes(rank: int, world_size: int, kind: str, modes: list, steps: int) -> dict:
    """Every (mode, optimizer) trained from scratch: {name: [steps, counts]},
    counts of the keys the caches staged (overflows) and prefetched."""
    out = {}
    for mode in modes:
        for optimizer in ("sgd", "adam"):
            sc = scenario(kind, mode, optimizer, steps)
            out[sc.name] = train(rank, world_size, sc, prefetch=mode == "cache_prefetch")
    return out
