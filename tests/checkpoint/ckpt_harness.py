"""Models, training and an independent reading of dynamic tables for the
checkpoint tests.

A ``Case`` is a sharded collection (EC or EBC, dynamic tables beside static
ones) with an optimizer and score strategy; ``build`` shards it at any world
size with the dynamicemb sharders, ``train`` runs a few steps on it, and
``contents`` reads every dynamic table straight from the hash table's state
tensors and the value buffer (not through the checkpoint code): per table,
the keys with their embedding, optimizer state and score words.
"""

import contextlib
import dataclasses
import json
import os
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tests.shard import shard_harness as h

T = h.TableSpec
DIST_TYPES = ("continuous", "roundrobin", "hash_roundrobin")
LR = 0.05


@dataclass
class Case:
    name: str
    kind: str  # "ec" or "ebc"
    tables: list[h.TableSpec]
    optimizer: str = "adam"
    score_strategy: Any = None  # None: the default (TIMESTAMP)
    steps: int = 3
    key_range: tuple[int, int] = (-6, 30)
    batch_size: int = 3
    max_length: int = 4
    options: dict[str, Any] = field(default_factory=dict)

    def scenario(self) -> h.Scenario:
        return h.Scenario(
            name=self.name,
            kind=self.kind,
            tables=self.tables,
            steps=self.steps,
            key_range=self.key_range,
            batch_size=self.batch_size,
            max_length=self.max_length,
        )

    @property
    def dynamic(self) -> list[str]:
        return [t.name for t in self.tables if t.dynamic]


def fused_params(optimizer: str) -> dict[str, Any]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb import DynamicEmbOptimType

    base = {"learning_rate": LR, "eps": 1e-8}
    if optimizer == "sgd":
        return {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    if optimizer == "adam":
        return dict(base, optimizer=EmbOptimType.ADAM, beta1=0.9, beta2=0.999)
    if optimizer == "adagrad":
        return dict(base, optimizer=EmbOptimType.EXACT_ADAGRAD)
    if optimizer == "rowwise_adagrad":
        return dict(base, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD)
    if optimizer == "ftrl":
        return {
            "optimizer": DynamicEmbOptimType.FTRL,
            "learning_rate": LR,
            "learning_rate_power": -0.5,
            "l1_reg": 0.001,
            "l2_reg": 0.001,
            "initial_accumulator_value": 0.1,
        }
    if optimizer == "rmsprop_ar":
        return {
            **base,
            "optimizer": DynamicEmbOptimType.ROWWISE_RMSPROP_AR,
            **h.RMSPROP_AR,
        }
    raise ValueError(f"unknown optimizer {optimizer!r}")


class Model(torch.nn.Module):
    def __init__(self, collection) -> None:
        super().__init__()
        self.sparse = torch.nn.Module()
        self.sparse.coll = collection

    def forward(self, kjt):
        return self.sparse.coll(kjt)


COLLECTION = "model.sparse.coll"


def build(case: Case, world_size: int, device: torch.device | None = None):
    """The case's model sharded over the default group."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from dynamicemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )

    device = device or h.worker_device()
    sc = case.scenario()
    collection = h.build_collection(sc, torch.device("cpu"))
    params = fused_params(case.optimizer)
    if case.kind == "ec":
        sharder = DynamicEmbeddingCollectionSharder(fused_params=params, static_fused_params=params)
    else:
        sharder = DynamicEmbeddingBagCollectionSharder(
            fused_params=params, static_fused_params=params
        )
    plan = h.hand_plan(sc, collection, sharder, world_size, device.type)
    for t in case.tables:
        if t.dynamic:
            ps = plan[t.name]
            extra = dict(case.options)
            if case.score_strategy is not None:
                extra["score_strategy"] = case.score_strategy
            ps.dynamicemb_options = dataclasses.replace(ps.dynamicemb_options, **extra)
    return DistributedModelParallel(
        Model(collection),
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=device,
        plan=ShardingPlan({"sparse.coll": plan}),
        sharders=[sharder],
    )


def kernels(model):
    from dynamicemb.shard import dynamic_embedding_kernels

    return dynamic_embedding_kernels(model)


def set_custom_score(model, score: int) -> None:
    for k in kernels(model):
        if "CUSTOMIZED" in [s.name for s in k.emb_module.strategies]:
            k.emb_module.set_score(score)


def train(model, case: Case, rank: int, steps: int | None = None, first: int = 0) -> None:
    sc = case.scenario()
    device = h.worker_device()
    model.train()
    for step in range(first, first + (case.steps if steps is None else steps)):
        set_custom_score(model, 100 + step)
        kjt = h.to_kjt(sc, h.batch_for(sc, step, rank)).to(device)
        outs = h.local_outputs(sc, model(kjt))
        targets = h.targets_for(sc, step, rank, {k: tuple(v.shape) for k, v in outs.items()})
        loss = sum(0.5 * ((v.double() - targets[k].to(device)) ** 2).sum() for k, v in outs.items())
        loss.backward()


def contents(model) -> dict[str, dict[str, torch.Tensor]]:
    """Every dynamic table on this rank, read from the raw state: table name
    -> keys (sorted), emb, opt (the row after the embedding), scores (the
    table's score words, its own column order), step."""
    from dynamicemb.dynamicemb_config import optimizer_state_dim
    from dynamicemb.storage import CachedStorage

    out = {}
    for k in kernels(model):
        emb = k.emb_module
        for t, name in enumerate(k.table_names):
            if isinstance(emb.storage, CachedStorage):
                # The cache holds some keys only: every key over both tiers.
                out[name] = _exported(emb, t)
                continue
            table = emb.rows.hash_table
            lo, hi = table.slot_range(t)
            ex = table.export_batch(lo, hi).compact()
            dim = emb.dims[t]
            sd = optimizer_state_dim(emb.optimizer.optimizer, dim, torch.float32)
            order = torch.argsort(ex.keys)
            _, rows, state = emb.storage.read_rows(ex.keys, ex.table_ids)
            out[name] = {
                "keys": ex.keys[order].cpu(),
                "emb": rows[order, :dim].cpu().clone(),
                "opt": state[order, :sd].cpu().clone(),
                "scores": (
                    torch.zeros(len(order), 0, dtype=torch.int64)
                    if emb.no_eviction
                    else ex.scores[order].cpu()
                ),
                "step": torch.tensor(emb.step),
            }
    return out


def _exported(emb, t: int) -> dict[str, torch.Tensor]:
    """``contents`` of table t of a cached module, from its storage's
    export (each key once, over the cache and the backing table)."""
    from dynamicemb.dynamicemb_config import optimizer_state_dim

    chunks = list(emb.storage.export_rows(t, 1 << 16))
    dim = emb.dims[t]
    sd = optimizer_state_dim(emb.optimizer.optimizer, dim, torch.float32)
    keys = torch.cat([c.keys.cpu() for c in chunks])
    order = torch.argsort(keys)
    emb_rows = torch.cat([c.embeddings.cpu().float() for c in chunks])
    opt = torch.cat([c.optimizer_state.cpu() for c in chunks])
    scores = torch.cat([c.scores.cpu() for c in chunks])
    return {
        "keys": keys[order],
        "emb": emb_rows[order, :dim].clone(),
        "opt": opt[order, :sd].clone(),
        "scores": scores[order],
        "step": torch.tensor(emb.step),
    }


def merge(per_rank: list[dict[str, dict[str, torch.Tensor]]]) -> dict[str, dict[str, torch.Tensor]]:
    """The tables of all ranks in one (keys sorted), plus each key's rank."""
    out = {}
    for name in per_rank[0]:
        parts = [r[name] for r in per_rank]
        keys = torch.cat([p["keys"] for p in parts])
        order = torch.argsort(keys)
        merged = {
            f: torch.cat([p[f] for p in parts])[order] for f in ("keys", "emb", "opt", "scores")
        }
        merged["rank"] = torch.cat(
            [torch.full((p["keys"].numel(),), r, dtype=torch.int64) for r, p in enumerate(parts)]
        )[order]
        merged["step"] = max(int(p["step"]) for p in parts)
        out[name] = merged
    return out


def static_weights(model) -> dict[str, torch.Tensor]:
    """This rank's shards of the static tables (TorchRec's state dict)."""
    out = {}
    for key, value in model.state_dict().items():
        local = value.local_shards() if hasattr(value, "local_shards") else None
        if local is not None:
            out[key] = torch.cat(
                [torch.zeros(0)] + [s.tensor.detach().cpu().reshape(-1) for s in local]
            )
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().cpu().clone()
    return out


def assert_same_tables(got, want, with_opt: bool = True, what: str = "") -> None:
    assert sorted(got) == sorted(want), (what, sorted(got), sorted(want))
    for name in want:
        g, w = got[name], want[name]
        assert torch.equal(g["keys"], w["keys"]), f"{what} {name}: keys differ"
        assert torch.equal(g["emb"], w["emb"]), f"{what} {name}: embeddings differ"
        if with_opt:
            assert torch.equal(g["opt"], w["opt"]), f"{what} {name}: optimizer state differs"
        assert torch.equal(g["scores"], w["scores"]), f"{what} {name}: scores differ"


def counters(model) -> dict[str, dict[str, torch.Tensor]]:
    """The admission counter of every dynamic table with one on this rank,
    read from the fused counter's hash table (not through ``Counter.dump``):
    table name -> keys (sorted) and their counts."""
    out = {}
    for k in kernels(model):
        admitter = k.emb_module.admitter
        if admitter is None or admitter.state() is None:
            continue
        table = admitter.state().table
        for t, name in enumerate(k.table_names):
            lo, hi = table.slot_range(t)
            ex = table.export_batch(lo, hi).compact()
            order = torch.argsort(ex.keys)
            out[name] = {"keys": ex.keys[order].cpu(), "counts": ex.scores[order, 0].cpu()}
    return out


def merge_counters(per_rank) -> dict[str, dict[str, torch.Tensor]]:
    """The counters of all ranks in one (keys sorted), plus each key's rank."""
    out = {}
    for name in per_rank[0]:
        keys = torch.cat([r[name]["keys"] for r in per_rank])
        order = torch.argsort(keys)
        out[name] = {
            "keys": keys[order],
            "counts": torch.cat([r[name]["counts"] for r in per_rank])[order],
            "rank": torch.cat(
                [torch.full((r[name]["keys"].numel(),), i) for i, r in enumerate(per_rank)]
            )[order],
        }
    return out


def assert_same_counters(got, want, what: str = "") -> None:
    assert sorted(got) == sorted(want), (what, sorted(got), sorted(want))
    for name in want:
        for f in ("keys", "counts"):
            assert torch.equal(got[name][f], want[name][f]), f"{what} {name}: counter {f} differ"


class Checks:
    """Named checks run one after another in one worker: ``@checks(name)``
    runs the function at once and records "ok" or its traceback in
    ``results`` (a failing check does not stop the others)."""

    def __init__(self) -> None:
        self.results: dict[str, str] = {}

    def __call__(self, name: str):
        def wrap(fn):
            try:
                fn()
                self.results[name] = "ok"
            except BaseException:
                self.results[name] = traceback.format_exc()
            return fn

        return wrap


def run_checks(fn, root: str, names: list[str]) -> dict[str, str]:
    """The results of ``fn(rank, world, root)`` (a ``Checks.results``) at one
    gloo rank, which must have run exactly ``names``."""
    (out,) = h.run_world(fn, 1, root)
    assert sorted(out) == sorted(names)
    return out


@contextlib.contextmanager
def failing_call(cls, method: str, n: int, message: str):
    """Within the block, the ``n``-th call of ``cls.method`` raises
    RuntimeError(message); yields the list of calls made (one entry each)."""
    real, calls = getattr(cls, method), []

    def failing(self, *a, **kw):
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError(message)
        return real(self, *a, **kw)

    setattr(cls, method, failing)
    try:
        yield calls
    finally:
        setattr(cls, method, real)


def canonical_crc(body: dict) -> int:
    """The manifest's checksum of its body as a dump writes it (the JSON with
    sorted keys and no spaces), computed here independently of the library."""
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def write_meta(path: str, table: str, meta: dict) -> None:
    """Writes ``table``'s meta JSON into the checkpoint at ``path`` and records
    its new size and CRC-32 in the manifest, the manifest's checksum
    recomputed: a checkpoint whose only fault is what the meta says."""
    data = json.dumps(meta).encode()
    with open(os.path.join(path, COLLECTION, f"{table}_meta.json"), "wb") as f:
        f.write(data)
    manifest_name = os.path.join(path, "dynamicemb_checkpoint.json")
    with open(manifest_name) as f:
        manifest = json.load(f)
    manifest.pop("checksum")
    manifest["collections"][COLLECTION][table] = {
        "file": f"{table}_meta.json",
        "bytes": len(data),
        "crc32": [zlib.crc32(data)],
    }
    manifest["checksum"] = canonical_crc(manifest)
    with open(manifest_name, "w") as f:
        f.write(json.dumps(manifest))
