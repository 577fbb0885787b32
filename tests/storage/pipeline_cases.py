"""A sharded cache trained through TorchRec's prefetch pipeline
(``PrefetchTrainPipelineSparseDist``) and in a plain loop, in the worker
processes of tests/shard/shard_harness.py: the pipeline prefetches batch
i + 1 on its own stream while batch i trains, through the sharded
collection's prefetch hook."""

import torch

from tests.shard import shard_harness as h
from tests.storage.sharded_cases import scenario


class PipelinedModel(torch.nn.Module):
    """An EmbeddingBagCollection whose loss weighs the pooled outputs by the
    batch's dense features (each step's fixed gradient); forward returns
    (loss, pooled outputs), as TorchRec's pipelines take it."""

    def __init__(self, collection) -> None:
        super().__init__()
        self.coll = collection

    def forward(self, batch):
        pooled = self.coll(batch.sparse_features).values()
        return (pooled * batch.dense_features).sum(), pooled.detach()


def _batches(sc: h.Scenario, rank: int, dims: int) -> list:
    from torchrec.datasets.utils import Batch

    out = []
    for step in range(sc.steps):
        g = torch.Generator().manual_seed(500 + step)
        out.append(
            Batch(
                dense_features=torch.randn(sc.batch_size, dims, generator=g),
                sparse_features=h.to_kjt(sc, h.batch_for(sc, step, rank)),
                labels=torch.zeros(sc.batch_size),
            )
        )
    return out


def _model(sc: h.Scenario, world_size: int, device: torch.device):
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    collection = h.build_collection(sc, torch.device("cpu"))
    sharder = h.sharder_for(sc)
    plan = ShardingPlan({"coll": h.hand_plan(sc, collection, sharder, world_size, device.type)})
    return DistributedModelParallel(
        PipelinedModel(collection),
        env=ShardingEnv.from_process_group(h.dist.group.WORLD),
        device=device,
        plan=plan,
        sharders=[sharder],
    )


def _rows(model, sc: h.Scenario, rank: int) -> dict:
    """Every seen key's row (found, embedding, optimizer state) per table."""
    from dynamicemb.shard import dynamic_embedding_kernels

    seen = {t.name: set() for t in sc.tables}
    for step in range(sc.steps):
        batch = h.batch_for(sc, step, rank)
        for t in sc.tables:
            for keys, _ in batch[t.feature]:
                seen[t.name].update(keys.tolist())
    out = {}
    for kernel in dynamic_embedding_kernels(model):
        m = kernel.emb_module
        for t, name in enumerate(kernel.table_names):
            k = torch.tensor(sorted(seen[name]), dtype=torch.int64, device=m.device)
            found, emb, state = m.storage.read_rows(k, torch.full_like(k, t))
            out[name] = (found, emb[:, : m.dims[t]], state[:, : m.layout.state_dims[t]])
    return out


def _prefetched(model) -> int:
    from dynamicemb.shard import dynamic_embedding_kernels

    return sum(int(k.emb_module.storage.prefetched) for k in dynamic_embedding_kernels(model))


def train_both(rank: int, world_size: int, optimizer: str, steps: int) -> dict:
    """The cache scenario trained in a plain loop and through the prefetch
    pipeline: each step's outputs, the rows at the end, the keys prefetched.
    ``{"skip": why}`` where the installed TorchRec's pipeline does not
    prefetch on this device."""
    from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist

    device = h.worker_device()
    sc = scenario("ebc", "cache_prefetch", optimizer, steps)
    dims = sum(t.dim for t in sc.tables)
    batches = _batches(sc, rank, dims)
    plain = _model(sc, world_size, device)
    plain_steps = []
    for b in batches:
        loss, out = plain(b.to(device))
        loss.backward()
        plain_steps.append(out.cpu())
    piped = _model(sc, world_size, device)
    # The pipeline steps an optimizer; the tables' is fused into the backward.
    dummy = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, device=device))], lr=0.0)
    pipeline = PrefetchTrainPipelineSparseDist(piped, dummy, device)
    it = iter(batches)
    piped_steps = []
    try:
        for _ in range(steps):
            piped_steps.append(pipeline.progress(it).cpu())
    except AssertionError as e:
        if device.type == "cpu" and "PrefetchPipelinedForward" in str(e):
            return {"skip": f"this TorchRec's prefetch pipeline does not prefetch on the CPU: {e}"}
        raise
    return {
        "plain": (plain_steps, _rows(plain, sc, rank), _prefetched(plain)),
        "pipeline": (piped_steps, _rows(piped, sc, rank), _prefetched(piped)),
    }
