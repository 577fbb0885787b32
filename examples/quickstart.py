"""The shortest path through the public API: one process, no GPU needed.

An EmbeddingBagCollection with one dynamic table (raw 64-bit ids, rows created
on first sight) and one static TorchRec table, planned by
DynamicEmbeddingShardingPlanner, sharded by DistributedModelParallel with
dynamicemb's sharder (a fused SGD in the backward), trained a few steps to
pull each id's pooled row towards a target; then the dynamic table is dumped
with DynamicEmbDump, changed, and loaded back with DynamicEmbLoad.

    python examples/quickstart.py            # on the GPU when there is one

Needs torch, torchrec and FBGEMM (on a CPU machine the wheel's extra
``torchrec-cpu-deps``; docs/building.md, "Extras").
Prints one line per step and ``quickstart: OK`` at the end; exits non-zero if
the loss did not fall or the loaded rows differ from the dumped ones.
"""

import os
import sys
import tempfile

import checkout  # noqa: F401 (examples/checkout.py: this checkout's dynamicemb)
import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.planner.types import ParameterConstraints

from dynamicemb import (
    DynamicEmbDump,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbLoad,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    get_table_value_bytes,
)
from dynamicemb.planner import (
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    topology,
)
from dynamicemb.shard import DynamicEmbeddingBagCollectionSharder, plan_and_shard

DIM, BATCH, STEPS = 8, 32, 20
FUSED = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5}


def build(device: torch.device):
    """The sharded model: table "user" dynamic, table "item" TorchRec's own."""
    configs = [
        EmbeddingBagConfig(
            name="user", embedding_dim=DIM, num_embeddings=4096, feature_names=["u"]
        ),
        EmbeddingBagConfig(name="item", embedding_dim=DIM, num_embeddings=100, feature_names=["i"]),
    ]
    constraints = {
        "user": DynamicEmbParameterConstraints(
            sharding_types=["row_wise"],
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(
                score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
                initializer_args=DynamicEmbInitializerArgs(
                    mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.1, upper=0.1
                ),
                # Every row in device memory on a GPU (ignored on the CPU).
                global_hbm_for_values=get_table_value_bytes(configs[0], FUSED["optimizer"], 1, 128),
            ),
        ),
        "item": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]),
    }
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    # fused_params configure the dynamic table, static_fused_params TorchRec's "item".
    sharder = DynamicEmbeddingBagCollectionSharder(fused_params=FUSED, static_fused_params=FUSED)
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs,
        topology=topology(world_size=1, compute_device=device.type, local_world_size=1),
        constraints=constraints,
        batch_size=BATCH,
        debug=False,
    )
    # The plan over the process group's ranks, then DistributedModelParallel with the sharder.
    model, _ = plan_and_shard(ebc, planner, [sharder], device)
    return model


def batch(device: torch.device, step: int) -> KeyedJaggedTensor:
    """One id per bag: user ids anywhere in the int64 range, distinct item ids < 100."""
    g = torch.Generator().manual_seed(step % 4)  # four batches, seen in turns
    users = torch.randint(0, 2**62, (BATCH,), generator=g)
    items = torch.randperm(100, generator=g)[:BATCH]
    return KeyedJaggedTensor(
        keys=["u", "i"],
        values=torch.cat([users, items]).to(device),
        lengths=torch.ones(2 * BATCH, dtype=torch.int32, device=device),
    )


def main() -> int:
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method="file://" + os.path.join(tmp, "rendezvous"),
            rank=0,
            world_size=1,
        )
        try:
            return run(device, tmp)
        finally:
            dist.destroy_process_group()


def run(device: torch.device, tmp: str) -> int:
    model = build(device)
    target = torch.linspace(-1, 1, DIM, device=device)
    losses = []
    for step in range(STEPS):
        pooled = model(batch(device, step))  # a KeyedTensor: look features up by name
        # Each row's gradient is (row - target): SGD at lr 0.5 halves its distance.
        loss = sum(0.5 * ((pooled[f] - target) ** 2).sum() for f in ("u", "i"))
        loss.backward()  # the fused optimizer updates the rows here
        losses.append(loss.item())
        print(f"step {step:2d} loss {losses[-1]:.4f}")
    if not losses[-1] < 0.5 * losses[0]:
        print(f"quickstart: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
        return 1

    # The dynamic table's rows are in model.state_dict() too (for torch.distributed.checkpoint);
    # DynamicEmbDump / DynamicEmbLoad write and read dynamicemb's own checksummed folder.
    probe = batch(device, 0)
    with torch.no_grad():
        before = model(probe)["u"]
    DynamicEmbDump(os.path.join(tmp, "ckpt"), model, optim=True)
    model(probe)["u"].sum().backward()  # moves the probe's rows
    with torch.no_grad():
        moved = model(probe)["u"]
    DynamicEmbLoad(os.path.join(tmp, "ckpt"), model, optim=True)
    with torch.no_grad():
        after = model(probe)["u"]
    if torch.equal(before, moved) or not torch.equal(before, after):
        print("quickstart: the loaded rows differ from the dumped ones")
        return 1
    print("quickstart: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
