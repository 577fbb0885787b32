"""A sharded model built as the spec describes it, read through the spec's API.

The spec tests use the names the spec gives only (``DynamicEmbTableOptions``,
``DynamicEmbeddingShardingPlanner``, ``DynamicEmbeddingCollectionSharder``,
``DynamicEmbDump``, ``incremental_dump``, ...): a model of one
``EmbeddingCollection`` whose tables are dynamic, planned by the planner and
sharded by ``DistributedModelParallel`` over the default group (or a given
one), trained a few steps on batches that depend on the step and the rank
only, and read back by eval lookups.
"""

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from tests.shard.shard_harness import ScenarioModel as Model
from tests.shard.shard_harness import run_world, worker_device  # noqa: F401 (re-exported)

# The collection's path: Model holds it as ``coll``.
COLLECTION = "model.coll"
DIM = 8
ROWS = 1 << 10  # num_embeddings of every table


@dataclasses.dataclass(frozen=True)
class Table:
    """One dynamic table: its name (its feature is ``f_<name>``) and options."""

    name: str
    options: Any  # DynamicEmbTableOptions
    num_embeddings: int = ROWS
    dim: int = DIM

    @property
    def feature(self) -> str:
        return f"f_{self.name}"


def fused_params(optimizer: str = "adam") -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    if optimizer == "adam":
        return {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.05, "eps": 1e-8}
    raise ValueError(f"unknown optimizer {optimizer!r}")


def build(
    tables: list[Table],
    optimizer: str = "adam",
    pg: dist.ProcessGroup | None = None,
    edit_plan=None,
):
    """The tables in one EmbeddingCollection, planned and sharded over ``pg``
    (default: the default group); ``edit_plan(plan)``, if given, changes the
    planner's plan before the model is sharded by it."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingCollection

    from dynamicemb.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
    from dynamicemb.shard import DynamicEmbeddingCollectionSharder

    pg = pg or dist.group.WORLD
    world_size = dist.get_world_size(pg)
    device = worker_device()
    # num_embeddings, embedding_dim, name
    configs = [
        EmbeddingConfig(t.num_embeddings, t.dim, t.name, feature_names=[t.feature]) for t in tables
    ]
    constraints = {
        t.name: DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=t.options)
        for t in tables
    }
    collection = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    model = Model(collection)
    sharder = DynamicEmbeddingCollectionSharder(fused_params=fused_params(optimizer))
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs,
        topology=Topology(
            world_size=world_size, compute_device=device.type, local_world_size=world_size
        ),
        constraints=constraints,
        debug=False,
    )
    plan = planner.collective_plan(model, [sharder], pg)
    if edit_plan is not None:
        edit_plan(plan)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=[sharder],
    )


def kjt(tables: list[Table], keys: dict[str, torch.Tensor]):
    """A batch of one bag per table, holding ``keys[name]`` (an empty bag
    for a table not named)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    values = [keys.get(t.name, torch.zeros(0, dtype=torch.int64)) for t in tables]
    return KeyedJaggedTensor(
        keys=[t.feature for t in tables],
        values=torch.cat(values).to(torch.int64),
        lengths=torch.tensor([v.numel() for v in values], dtype=torch.int32),
    ).to(worker_device())


def batch_keys(
    tables: list[Table], step: int, rank: int, n: int = 12, high: int = 64, low: int = 0
):
    """The keys of one training batch: ``n`` per table, drawn from
    ``[low, high)`` by (step, rank, table)."""
    out = {}
    for i, t in enumerate(tables):
        g = torch.Generator().manual_seed(1_000_003 * step + 7919 * rank + i)
        out[t.name] = torch.randint(low, high, (n,), generator=g, dtype=torch.int64)
    return out


def seen_keys(tables: list[Table], steps, world: int, **kwargs) -> dict[str, set[int]]:
    """The keys of every rank's batches of ``steps``, per table."""
    out = {t.name: set() for t in tables}
    for step in steps:
        for rank in range(world):
            for name, keys in batch_keys(tables, step, rank, **kwargs).items():
                out[name].update(keys.tolist())
    return out


def train_on(model, tables: list[Table], keys: dict[str, torch.Tensor]) -> None:
    """One training step on a batch of these keys."""
    model.train()
    out = model(kjt(tables, keys))
    loss = sum((out[t.feature].values().double() - 1.0).pow(2).sum() for t in tables)
    loss.backward()


def train(model, tables: list[Table], steps, rank: int, **kwargs) -> None:
    """Trains on this rank's batches of ``steps`` (step numbers); ``kwargs``
    as ``batch_keys``'."""
    for step in steps:
        train_on(model, tables, batch_keys(tables, step, rank, **kwargs))


def lookup(model, tables: list[Table], keys: torch.Tensor) -> dict[str, torch.Tensor]:
    """Eval lookups of ``keys`` in every table: table name -> (n, dim) on
    the CPU. A key a table does not hold reads its eval initializer's row
    (zeros by default) and is not inserted."""
    model.eval()
    with torch.no_grad():
        out = model(kjt(tables, {t.name: keys for t in tables}))
    model.train()
    return {t.name: out[t.feature].values().detach().cpu().clone() for t in tables}
