"""Training jobs that publish a delta after every step, replicas that follow
them, and the comparisons of the replication tests.

The models are the checkpoint tests' (``ckpt_harness``): a sharded
EmbeddingCollection of dynamic tables trained on the shard harness's batches;
``contents`` reads a table straight from its hash table and value buffer. A
replica is the same model with more room (``replica_case``), so that it can
hold every key its source holds in its own layout.
"""

import dataclasses
import os

import torch
import torch.distributed as dist

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb import EvictedItemMode
from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
COLL = c.COLLECTION
STEPS = 20
ERASE_STEPS = (5, 12)


def case(
    name: str,
    strategy,
    optimizer: str = "adam",
    dist_type: str = "hash_roundrobin",
    retain: bool = True,
    num_embeddings: int = 100,
    tables: tuple[str, ...] = ("t0",),
    bucket_capacity: int = 16,
) -> c.Case:
    """A case that evicts: far more distinct keys (0..600) than its tables
    hold (128 slots per rank at two ranks)."""
    return c.Case(
        name,
        "ec",
        [T(t, num_embeddings, 4, dist_type=dist_type) for t in tables],
        optimizer=optimizer,
        score_strategy=strategy,
        key_range=(0, 600),
        batch_size=8,
        max_length=6,
        steps=1,
        options={
            "bucket_capacity": bucket_capacity,
            "evicted_item_mode": EvictedItemMode.RETAIN_KEY if retain else EvictedItemMode.DISCARD,
        },
    )


def replica_case(source: c.Case, num_embeddings: int = 4096, **options) -> c.Case:
    """The source's tables with room for every key the source can hold."""
    tables = [dataclasses.replace(t, num_embeddings=num_embeddings) for t in source.tables]
    return dataclasses.replace(source, tables=tables, options=dict(source.options, **options))


def erase_batch(step: int) -> torch.Tensor:
    """Keys erased after ``step`` (the same on every rank)."""
    return torch.arange(step % 7, 600, 11, dtype=torch.int64)


def train_and_publish(rank: int, world: int, cases: list[c.Case], folder: str, steps: int = STEPS):
    """Trains every case for ``steps`` steps with an incremental dump after
    each (all-gathered; rank 0 writes it to ``folder/<case>``), erasing keys at
    ERASE_STEPS. Returns per case this rank's table contents after each step
    and the sequence numbers."""
    from dynamicemb.incremental_dump import get_score, incremental_dump
    from dynamicemb.replication import erase_keys, write_delta

    out = {}
    for cs in cases:
        model = c.build(cs, world)
        threshold = get_score(model)
        snaps, slots, seqs = [], [], []
        for step in range(steps):
            c.train(model, cs, rank, steps=1, first=step)
            if step in ERASE_STEPS:
                erase_keys(model, {COLL: {t: erase_batch(step) for t in cs.dynamic}})
            deltas = incremental_dump(model, threshold, dist.group.WORLD)
            threshold = {
                coll: {n: m["current_score"] for n, m in zip(d.table_names, d.meta)}
                for coll, d in deltas.items()
            }
            seq = deltas[COLL].meta[0]["sequence"]
            if rank == 0:
                write_delta(os.path.join(folder, cs.name), seq, deltas)
            dist.barrier()
            snaps.append(c.contents(model))
            slots.append(slot_keys(model))
            seqs.append(seq)
        out[cs.name] = {"contents": snaps, "slots": slots, "sequences": seqs}
    return out


def follow(rank: int, world: int, cases: list[c.Case], folder: str, mode: str):
    """Builds each replica case at ``world`` ranks and replays its deltas in
    order (``mode``: "slot" or "key"); returns per case this rank's contents
    after each delta, the replay stats, and an eval lookup at the end."""
    from dynamicemb.replication import replay_by_key, replay_increment
    from dynamicemb.replication.stream import delta_path, list_deltas, read_delta

    replay = replay_increment if mode == "slot" else replay_by_key
    out = {}
    for cs in cases:
        model = c.build(cs, world)
        model.eval()
        path = os.path.join(folder, cs.name)
        snaps, slots, stats = [], [], []
        for seq in list_deltas(path):
            got, deltas = read_delta(delta_path(path, seq))
            assert got == seq
            stats.append(replay(model, deltas))
            snaps.append(c.contents(model))
            slots.append(slot_keys(model))
        out[cs.name] = {
            "contents": snaps,
            "slots": slots,
            "stats": stats,
            "eval": eval_lookup(model, cs, rank),
        }
    return out


def slot_keys(model) -> dict[str, torch.Tensor]:
    """Per table, the key in each of its slots (the empty key where free)."""
    out = {}
    for k in c.kernels(model):
        emb = k.emb_module
        for t, name in enumerate(k.table_names):
            lo, hi = emb.rows.hash_table.slot_range(t)
            out[name] = emb.rows.hash_table.keys[lo:hi].cpu().clone()
    return out


def eval_lookup(model, cs: c.Case, rank: int):
    """(keys, rows) of an eval forward of every key 0..599 of each table,
    split among the ranks."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    world = dist.get_world_size()
    keys = torch.arange(rank, 600, world, dtype=torch.int64)
    names = [t.feature for t in cs.tables]
    kjt = KeyedJaggedTensor(
        keys=names,
        values=torch.cat([keys] * len(names)),
        lengths=torch.ones(keys.numel() * len(names), dtype=torch.int64),
    ).to(h.worker_device())
    with torch.no_grad():
        out = model(kjt)
    return keys, {f: out[f].values().float().cpu() for f in names}


def merge(per_rank: list[dict], step: int) -> dict:
    return c.merge([r["contents"][step] for r in per_rank])


def assert_replica_equals(replica: dict, source: dict, strategy, what: str) -> None:
    """Same keys, embeddings and optimizer state bit for bit; the score words
    too, except a timestamp (a replica rebases ages onto its own clock)."""
    assert sorted(replica) == sorted(source)
    strategies = strategy if isinstance(strategy, tuple) else (strategy,)
    from dynamicemb.storage.score_function import table_score_columns

    cols = table_score_columns(strategies)
    exact = [cols[j] for j, s in enumerate(strategies) if s != S.TIMESTAMP]
    for name in source:
        r, s = replica[name], source[name]
        assert torch.equal(r["keys"], s["keys"]), (
            f"{what} {name}: keys differ: replica lacks "
            f"{sorted(set(s['keys'].tolist()) - set(r['keys'].tolist()))[:10]}, has extra "
            f"{sorted(set(r['keys'].tolist()) - set(s['keys'].tolist()))[:10]}"
        )
        assert torch.equal(r["emb"], s["emb"]), f"{what} {name}: embeddings differ"
        assert torch.equal(r["opt"], s["opt"]), f"{what} {name}: optimizer state differs"
        if strategies != (S.NO_EVICTION,):
            assert torch.equal(r["scores"][:, exact], s["scores"][:, exact]), (
                f"{what} {name}: score words differ"
            )


def assert_owned(merged: dict, world: int, dist_type: str) -> None:
    """Every key sits on the rank that owns it at ``world`` ranks."""
    from dynamicemb.shard.routing import route_keys

    for name, t in merged.items():
        if t["keys"].numel():
            want = route_keys(t["keys"], world, dist_type)
            assert torch.equal(t["rank"], want), f"{name}: a key on the wrong rank"


def assert_same_slots(trainer: list[dict], replicas: list[dict], cases, world: int) -> None:
    """Slot for slot: after every step, the same key in every slot of every
    table of the job and of a replica of its layout."""
    for cs in cases:
        for rank in range(world):
            for step in range(STEPS):
                want = trainer[rank][cs.name]["slots"][step]
                got = replicas[rank][cs.name]["slots"][step]
                for name in want:
                    assert torch.equal(got[name], want[name]), (cs.name, step, name)
