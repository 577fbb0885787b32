"""A model with dynamic tables and its TorchRec twin, both sharded with
DistributedModelParallel over gloo, trained on the same batches.

The dynamic model (two EmbeddingBagCollections, one weighted, and an
EmbeddingCollection, static tables among the dynamic ones) is planned by
DynamicEmbeddingShardingPlanner and sharded by the dynamicemb sharders; its
twin (construct_twin_module) by TorchRec's planner and sharders with the twin
constraints (row-wise, FUSED). Each step's outputs and, at the end, every
dynamic row (read back by key from the hash tables) must equal the twin's
(outputs of the step, rows read from its sharded weights) within 1e-5.

The dynamic tables are fused into several modules (SUM and MEAN pooling,
different bucket capacities), so a table's position in its module differs
from its position among its collection's dynamic tables: the initializer ids
the sharders give them must be the ones construct_twin_module uses.

The `multigpu` cases run the same pair with NCCL, one process per visible
GPU, with every optimizer (FBGEMM's CUDA TBE has Adam).
"""

from typing import Any

import pytest
import torch
import torch.distributed as dist

from dynamicemb.shard import dynamic_embedding_kernels
from tests.shard import shard_harness as h

STEPS = 3
BATCH = 3
MAX_LEN = 4
LR = 0.05

# (name, num_embeddings, dim, dynamic, pooling, bucket_capacity)
EBC_TABLES = [
    ("a0", 48, 4, True, "SUM", 128),
    ("as", 20, 4, False, "SUM", None),
    ("a1", 40, 4, True, "MEAN", 128),
    ("a2", 36, 8, True, "SUM", 64),
]
WBC_TABLES = [
    ("w0", 30, 4, True, "SUM", 64),
    ("w1", 44, 8, True, "SUM", 128),
]
EC_TABLES = [
    ("es", 24, 4, False, None, None),
    ("e0", 40, 4, True, None, 128),
    ("e1", 32, 4, True, None, 64),
]
ALL_TABLES = {t[0]: t for t in EBC_TABLES + WBC_TABLES + EC_TABLES}
DYNAMIC = sorted(name for name, t in ALL_TABLES.items() if t[3])


def _feature(name: str) -> str:
    return f"f_{name}"


class TwinTestModel(torch.nn.Module):
    def __init__(self, device: torch.device) -> None:
        super().__init__()
        from torchrec.modules.embedding_configs import (
            EmbeddingBagConfig,
            EmbeddingConfig,
            PoolingType,
        )
        from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

        torch.manual_seed(0)  # static tables: the same weights in both models, every rank

        def bags(tables):
            return [
                EmbeddingBagConfig(
                    name=n,
                    num_embeddings=rows,
                    embedding_dim=dim,
                    feature_names=[_feature(n)],
                    pooling=PoolingType[pooling],
                )
                for n, rows, dim, _, pooling, _ in tables
            ]

        self.ebc = EmbeddingBagCollection(tables=bags(EBC_TABLES), device=device)
        self.wbc = EmbeddingBagCollection(tables=bags(WBC_TABLES), is_weighted=True, device=device)
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name=n, num_embeddings=rows, embedding_dim=dim, feature_names=[_feature(n)]
                )
                for n, rows, dim, _, _, _ in EC_TABLES
            ],
            device=device,
        )

    def forward(self, ebc_kjt, wbc_kjt, ec_kjt):
        return self.ebc(ebc_kjt), self.wbc(wbc_kjt), self.ec(ec_kjt)


def constraints() -> dict[str, Any]:
    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.planner import DynamicEmbParameterConstraints

    out = {}
    for name, (_, _, _, dynamic, pooling, bucket) in ALL_TABLES.items():
        if dynamic:
            out[name] = DynamicEmbParameterConstraints(
                use_dynamicemb=True,
                dynamicemb_options=DynamicEmbTableOptions(
                    bucket_capacity=bucket, dist_type="hash_roundrobin"
                ),
            )
        else:
            # TorchRec offers table-wise (not row-wise) EBC sharding on the CPU.
            kind = "table_wise" if pooling is not None else "row_wise"
            out[name] = DynamicEmbParameterConstraints(
                sharding_types=[kind], compute_kernels=["fused"]
            )
    return out


def fused_params(optimizer: str) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    if optimizer == "rowwise_adagrad":
        return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR, "eps": 1e-8}
    if optimizer == "adam":
        return {
            "optimizer": EmbOptimType.ADAM,
            "learning_rate": LR,
            "eps": 1e-8,
            "beta1": 0.9,
            "beta2": 0.999,
        }
    raise ValueError(f"unknown optimizer {optimizer!r}")


def cpu_tbe_support(optimizer: str) -> str:
    """'' when FBGEMM's CPU TBE trains with ``optimizer``, else its error."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    params = fused_params(optimizer)
    kwargs = {k: v for k, v in params.items() if k != "optimizer"}
    try:
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(8, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=params["optimizer"],
            **kwargs,
        )
        tbe(torch.tensor([1, 2]), torch.tensor([0, 1, 2])).sum().backward()
    except Exception as e:  # the reason is reported in the skip message
        return f"{type(e).__name__}: {e}"
    return ""


def _batch(step: int, rank: int, tables, weighted: bool):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(104729 * step + 7919 * rank + len(tables))
    values, lengths, weights = [], [], []
    for _, rows, _, _, _, _ in tables:
        for _ in range(BATCH):
            n = int(torch.randint(0, MAX_LEN + 1, (1,), generator=g))
            values.append(torch.randint(0, rows, (n,), generator=g))
            weights.append(torch.rand(n, generator=g) + 0.5)
            lengths.append(n)
    return KeyedJaggedTensor(
        keys=[_feature(t[0]) for t in tables],
        values=torch.cat(values),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        weights=torch.cat(weights) if weighted else None,
    )


def batches(step: int, rank: int):
    return (
        _batch(step, rank, EBC_TABLES, False),
        _batch(step, rank, WBC_TABLES, True),
        _batch(step, rank, EC_TABLES, False),
    )


def _flat_outputs(outs) -> dict[str, torch.Tensor]:
    pooled, weighted, seq = outs
    flat = {}
    for prefix, kt in (("ebc", pooled), ("wbc", weighted)):
        # By feature: the column order of a sharded KeyedTensor follows its
        # shardings, which differ between the two models.
        for key, value in kt.to_dict().items():
            flat[f"{prefix}.{key}"] = value
    for key in sorted(seq.keys()):
        flat[f"ec.{key}"] = seq[key].values()
    return flat


def _train(model, rank: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    steps = []
    for step in range(STEPS):
        outs = _flat_outputs(model(*(kjt.to(device) for kjt in batches(step, rank))))
        g = torch.Generator().manual_seed(31 * step + rank)
        loss = sum(
            0.5 * ((v - torch.randn(v.shape, generator=g).to(device)) ** 2).sum()
            for _, v in sorted(outs.items())
        )
        loss.backward()
        steps.append({k: v.detach().cpu().clone() for k, v in outs.items()})
    return steps


def _twin_ebc_sharder(params):
    """TorchRec's EmbeddingBagCollectionSharder, offering row-wise on the CPU
    too: its row-wise pooled sharding runs on gloo, but the sharder lists it
    for CUDA only."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    class CpuRowWiseEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = list(super().sharding_types(compute_device_type))
            return types if "row_wise" in types else types + ["row_wise"]

    return CpuRowWiseEmbeddingBagCollectionSharder(fused_params=params)


def _static_tables(dmp):
    """The sharded tensors of a model's state dict (its dynamic tables'
    entries hold their rows as objects: dynamicemb/checkpoint/model_state.py)."""
    return [(k, v) for k, v in dmp.state_dict().items() if hasattr(v, "local_shards")]


def _load_weights(dmp, state: dict[str, torch.Tensor]) -> None:
    """Copies the unsharded model's weights into the sharded tables. (A
    sharded EmbeddingBagCollection on the CPU keeps FBGEMM's initial weights:
    TorchRec copies the module's only on other devices.)"""
    with torch.no_grad():
        for key, value in _static_tables(dmp):
            for shard in value.local_shards():
                (r, c), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(state[key][r : r + rows, c : c + cols])
    for key, value in _static_tables(dmp):
        for shard in value.local_shards():
            (r, c), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            assert torch.equal(shard.tensor.cpu(), state[key][r : r + rows, c : c + cols]), key


def _dynamic_rows(model) -> dict[str, dict[int, torch.Tensor]]:
    """Every key a dynamic table of this rank holds, with its row."""
    rows: dict[str, dict[int, torch.Tensor]] = {}
    for kernel in dynamic_embedding_kernels(model):
        module = kernel.emb_module
        for t, name in enumerate(kernel.table_names):
            keys = torch.arange(ALL_TABLES[name][1], device=module.device)
            held, emb, _ = module.storage.read_rows(keys, torch.full_like(keys, t))
            values = emb[held, : module.dims[t]].cpu()
            rows[name] = {int(k): v.clone() for k, v in zip(keys[held].tolist(), values)}
    return rows


def _twin_rows(twin) -> dict[str, dict[int, torch.Tensor]]:
    """This rank's rows of the twin's row-wise tables, by global row."""
    rows: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in twin.state_dict().items():
        name = key.split(".")[-2]
        if name not in DYNAMIC:
            continue
        rows[name] = {}
        for shard in value.local_shards():
            offset = shard.metadata.shard_offsets[0]
            for i, row in enumerate(shard.tensor.detach().cpu()):
                rows[name][offset + i] = row.clone()
    return rows


def run_pair(rank: int, world_size: int, optimizers: list[str]) -> dict[str, Any]:
    """Shards the model and its twin, trains both with each optimizer, on
    this rank's device (``h.worker_device()``). The unsharded models are
    built on the CPU; their weights are copied into the sharded tables."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.types import ShardingEnv

    from dynamicemb.planner import DynamicEmbeddingShardingPlanner
    from dynamicemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )
    from dynamicemb.twin import construct_twin_module, dynamic_table_ids

    device = h.worker_device()
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    topology = Topology(
        world_size=world_size, compute_device=device.type, local_world_size=world_size
    )
    result: dict[str, Any] = {}
    for optimizer in optimizers:
        params = fused_params(optimizer)
        cons = constraints()
        model = TwinTestModel(torch.device("cpu"))
        twin, twin_cons = construct_twin_module(model, cons, fused_params=params)
        ids = dynamic_table_ids(model, cons)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        twin_state = {k: v.detach().clone() for k, v in twin.state_dict().items()}

        sharders = [
            DynamicEmbeddingBagCollectionSharder(fused_params=params, static_fused_params=params),
            DynamicEmbeddingCollectionSharder(fused_params=params, static_fused_params=params),
        ]
        configs = [c for m in (model.ebc, model.wbc) for c in m.embedding_bag_configs()]
        configs += model.ec.embedding_configs()
        planner = DynamicEmbeddingShardingPlanner(
            eb_configs=configs, topology=topology, constraints=cons, batch_size=BATCH
        )
        plan = planner.collective_plan(model, sharders, dist.group.WORLD)
        dyn = DistributedModelParallel(model, env=env, device=device, plan=plan, sharders=sharders)
        _load_weights(dyn, state)  # the static tables

        twin_sharders = [_twin_ebc_sharder(params), EmbeddingCollectionSharder(fused_params=params)]
        twin_planner = EmbeddingShardingPlanner(
            topology=topology, constraints=twin_cons, batch_size=BATCH
        )
        twin_plan = twin_planner.collective_plan(twin, twin_sharders, dist.group.WORLD)
        twin_dmp = DistributedModelParallel(
            twin, env=env, device=device, plan=twin_plan, sharders=twin_sharders
        )
        _load_weights(twin_dmp, twin_state)

        kernel_ids = {}
        for kernel in dynamic_embedding_kernels(dyn):
            for name, tid in kernel.initializer_table_ids.items():
                assert kernel_ids.setdefault(name, tid) == tid, (name, kernel_ids[name], tid)
        twin_kinds = {
            name: (ps.sharding_type, ps.compute_kernel)
            for module_plan in twin_plan.plan.values()
            for name, ps in module_plan.items()
        }
        result[optimizer] = {
            "twin_ids": ids,
            "kernel_ids": kernel_ids,
            "groups": [kernel.table_names for kernel in dynamic_embedding_kernels(dyn)],
            "twin_kinds": twin_kinds,
            "dyn_steps": _train(dyn, rank, device),
            "twin_steps": _train(twin_dmp, rank, device),
            "dyn_rows": _dynamic_rows(dyn),
            "twin_rows": _twin_rows(twin_dmp),
        }
    return result


# ------------------------------------------------------------------ tests --

OPTIMIZERS = ("sgd", "adam", "rowwise_adagrad")


def _supported():
    return [o for o in OPTIMIZERS if not cpu_tbe_support(o)]


@pytest.fixture(scope="module")
def world2():
    return h.run_world(run_pair, 2, _supported())


@pytest.fixture(scope="module")
def world1():
    return h.run_world(run_pair, 1, ["sgd"])


def _check_ids(runs):
    for rank, run in enumerate(runs):
        for optimizer, r in run.items():
            # Several fused modules per collection: positions in a module are
            # not the collection positions, so a mismatch would show.
            assert len(r["groups"]) > 3, r["groups"]
            assert set(r["kernel_ids"]) == set(DYNAMIC), (rank, r["kernel_ids"])
            assert r["kernel_ids"] == r["twin_ids"], (
                rank,
                optimizer,
                r["kernel_ids"],
                r["twin_ids"],
            )


def test_sharders_use_the_twin_table_ids_world1(world1):
    _check_ids(world1)


def test_sharders_use_the_twin_table_ids_world2(world2):
    _check_ids(world2)


def test_twin_plan_is_row_wise_fused(world2):
    kinds = world2[0][next(iter(world2[0]))]["twin_kinds"]
    for name in DYNAMIC:
        assert kinds[name] == ("row_wise", "fused"), (name, kinds[name])


def _check_training(runs, optimizer):
    rows_dyn: dict[str, dict[int, torch.Tensor]] = {name: {} for name in DYNAMIC}
    rows_twin: dict[str, dict[int, torch.Tensor]] = {name: {} for name in DYNAMIC}
    touched: dict[str, set] = {name: set() for name in DYNAMIC}
    for rank, run in enumerate(runs):
        r = run[optimizer]
        for step, (d, t) in enumerate(zip(r["dyn_steps"], r["twin_steps"])):
            assert sorted(d) == sorted(t)
            for k in t:
                assert d[k].shape == t[k].shape, (rank, step, k)
                torch.testing.assert_close(
                    d[k], t[k], rtol=0, atol=1e-5, msg=lambda m: f"rank {rank} step {step} {k}: {m}"
                )
        for name, held in r["dyn_rows"].items():
            overlap = set(held) & set(rows_dyn[name])
            assert not overlap, f"table {name}: keys {sorted(overlap)} held by two ranks"
            rows_dyn[name].update(held)
        for name, held in r["twin_rows"].items():
            rows_twin[name].update(held)
        for step in range(STEPS):
            for kjt in batches(step, rank):
                for key in kjt.keys():
                    name = key[len("f_") :]
                    if name in touched:
                        touched[name].update(kjt[key].values().tolist())
    for name in DYNAMIC:
        assert sorted(rows_twin[name]) == list(range(ALL_TABLES[name][1])), name
        # The dynamic tables hold exactly the keys training saw.
        assert set(rows_dyn[name]) == touched[name], name
        assert touched[name], name
        keys = sorted(touched[name])
        got = torch.stack([rows_dyn[name][k] for k in keys])
        want = torch.stack([rows_twin[name][k] for k in keys])
        torch.testing.assert_close(
            got, want, rtol=0, atol=1e-5, msg=lambda m: f"table {name} rows: {m}"
        )


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_sharded_twin_trains_like_the_dynamic_model(world2, optimizer):
    reason = cpu_tbe_support(optimizer)
    if reason:
        pytest.skip(f"FBGEMM's CPU TBE cannot train the twin with {optimizer}: {reason}")
    _check_training(world2, optimizer)


def test_sharded_twin_world1_sgd(world1):
    _check_training(world1, "sgd")


# ------------------------------------------------- NCCL, one rank per GPU --


def _gpu_world() -> int:
    return max(2, torch.cuda.device_count() if torch.cuda.is_available() else 0)


@pytest.fixture(scope="module")
def gpu_world():
    return h.run_world(run_pair, _gpu_world(), list(OPTIMIZERS), device_type="cuda")


@pytest.mark.multigpu
def test_nccl_sharders_use_the_twin_table_ids(gpu_world):
    _check_ids(gpu_world)


@pytest.mark.multigpu
def test_nccl_twin_plan_is_row_wise_fused(gpu_world):
    kinds = gpu_world[0][next(iter(gpu_world[0]))]["twin_kinds"]
    for name in DYNAMIC:
        assert kinds[name] == ("row_wise", "fused"), (name, kinds[name])


@pytest.mark.multigpu
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_nccl_sharded_twin_trains_like_the_dynamic_model(gpu_world, optimizer):
    _check_training(gpu_world, optimizer)
