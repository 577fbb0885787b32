"""An inference table kept current by a stream: a job of two gloo ranks
publishes a delta per step (DeltaPublisher, keys erased at one step, a
checkpoint after step 3 that prunes the deltas before it); a DeltaFollower
brings the inference table from nothing to the job's last step while another
thread looks up all the time. Every lookup reads one state whole: the job's
tables after one of its steps, never a mixture. Then the table refuses
deltas that do not follow (another run, a duplicate, a gap, a corrupted or
one-rank delta, another dim), changing nothing. A serving process that
follows the stream imports none of the training code."""

import dataclasses
import os
import subprocess
import sys
import threading

import pytest
import torch

from dynamicemb import EvictedItemMode
from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
from tests.checkpoint import ckpt_harness as c
from tests.inference import inference_harness as ih
from tests.shard import shard_harness as h

STEPS, CHECKPOINT_AFTER, ERASE_AT = 10, 3, 6
CASE = dataclasses.replace(
    ih.case("stream"), options={"evicted_item_mode": EvictedItemMode.RETAIN_KEY}
)
NAMES = [t.name for t in CASE.tables]
KEYS = torch.arange(-25, 405)  # every key the job can see, and some it cannot


def _publish(rank, world, folder):
    from dynamicemb.replication import DeltaPublisher, erase_keys

    model = c.build(CASE, world)
    pub = DeltaPublisher(model, folder)
    history = []
    for step in range(STEPS):
        c.train(model, CASE, rank, steps=1, first=step)
        if step == ERASE_AT:
            erased = torch.arange(0, 400, 7, dtype=torch.int64)
            erase_keys(model, {c.COLLECTION: dict.fromkeys(NAMES, erased)})
        seq = pub.publish()
        if step + 1 == CHECKPOINT_AFTER:
            pub.checkpoint()
        history.append({"sequence": seq, "contents": c.contents(model)})
    return history


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """(folder, [(sequence, rows of every table)] after each step)."""
    folder = str(tmp_path_factory.mktemp("inference_stream") / "stream")
    per_rank = h.run_world(_publish, 2, folder)
    states = [
        (per_rank[0][s]["sequence"], ih.rows_of([r[s]["contents"] for r in per_rank]))
        for s in range(STEPS)
    ]
    return folder, states


def _table(dtype=torch.float32, dims=None):
    dims = dims or {t.name: t.dim for t in CASE.tables}
    return InferenceEmbeddingTable(
        [InferenceTableConfig(n, dims[n], [f"f_{n}"]) for n in NAMES], dtype=dtype
    )


def _probe():
    """Bags of one key each: every key of KEYS in every table."""
    ids = KEYS.repeat(len(NAMES))
    return ids, torch.arange(ids.numel() + 1)


def _expected(rows) -> torch.Tensor:
    """What the probe reads from a state's rows (zeros where not held)."""
    parts = []
    for n in NAMES:
        dim = next(t.dim for t in CASE.tables if t.name == n)
        parts.append(ih.lookup_rows(rows[n], KEYS, torch.zeros(KEYS.numel(), dim)).float())
    return torch.cat(parts, dim=1)


def test_a_follower_updates_the_table_while_lookups_read_whole_states(stream):
    from dynamicemb.replication import DeltaFollower

    folder, states = stream
    table = _table()
    follower = DeltaFollower(table, folder)
    ids, offsets = _probe()
    # Nothing yet (zeros), then the job's tables after each step.
    valid = [torch.zeros_like(_expected(states[0][1]))] + [_expected(r) for _, r in states]
    seen, torn, done = set(), [], threading.Event()

    def reader():
        while not done.is_set():
            got = table(ids, offsets)
            match = [i for i, v in enumerate(valid) if torch.equal(got, v)]
            if match:
                seen.add(match[0])
            else:
                torn.append(got)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        applied = follower.poll()
    finally:
        done.set()
        thread.join()
    assert not torn, f"{len(torn)} lookups read no single state"
    assert follower.loaded_checkpoint
    seq_ckpt = states[CHECKPOINT_AFTER - 1][0]
    assert applied == [s for s, _ in states if s > seq_ckpt]
    assert follower.sequence == states[-1][0] and follower.poll() == []
    assert torch.equal(table(ids, offsets), valid[-1])
    final = states[-1][1]
    assert table.sizes() == {n: final[n]["keys"].numel() for n in NAMES}
    for n in NAMES:  # erased keys are gone (they read zeros), the rest exact
        keys, stored = table.stored_rows(n)
        assert torch.equal(keys, final[n]["keys"])
        assert torch.equal(stored.double(), final[n]["emb"])
    assert len(seen) >= 2  # the lookups overlapped the updates


def test_an_int8_table_follows_the_stream_within_its_bound(stream):
    from dynamicemb.replication import DeltaFollower

    folder, states = stream
    table = _table(torch.int8)
    DeltaFollower(table, folder).poll()
    final = states[-1][1]
    for n in NAMES:
        keys, _ = table.stored_rows(n)
        assert torch.equal(keys, final[n]["keys"])
        rows = final[n]["emb"]
        step = (rows.amax(1, keepdim=True) - rows.amin(1, keepdim=True)) / 255
        err = (table.rows(n, keys).double() - rows).abs() - step / 2 * (1 + 2.0**-20)
        assert float(err.max()) <= 1e-7


def _followed(stream):
    from dynamicemb.replication import DeltaFollower
    from dynamicemb.replication.stream import delta_path, list_deltas, read_delta

    folder, _ = stream
    table = _table()
    DeltaFollower(table, folder).poll()
    last = list_deltas(folder)[-1]
    _, deltas = read_delta(delta_path(folder, last))
    return table, deltas


def _edited(deltas, **meta):
    """A copy of ``deltas`` with ``meta`` entries changed in every table
    (checksums recomputed: well-formed, only out of place)."""
    from dynamicemb.replication import DeltaDumpResult, delta_checksum

    out = {}
    for coll, d in deltas.items():
        e = DeltaDumpResult()
        for i in range(len(d)):
            entry = d.table(i)
            entry["meta"] = {**entry["meta"], **meta}
            entry["meta"]["checksum"] = delta_checksum(entry)
            e.append(entry)
        out[coll] = e
    return out


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"run": "another-run"}, "DeltaError", "foreign"),
        ({}, "DeltaError", "duplicate"),
        ("gap", "DeltaError", "missing"),
        ({"rank": 0}, "DeltaError", "rank 0 only"),
        ("corrupt", "DeltaError", "corrupted"),
    ],
)
def test_a_delta_that_does_not_follow_changes_nothing(stream, change, error, match):
    from dynamicemb.replication import DeltaError

    table, deltas = _followed(stream)
    seq = deltas[c.COLLECTION].meta[0]["sequence"]
    if change == "gap":
        bad = _edited(deltas, sequence=seq + 2)
    elif change == "corrupt":
        bad = _edited(deltas, sequence=seq + 1)
        bad[c.COLLECTION].values[1] = bad[c.COLLECTION].values[1] + 1.0
    else:
        bad = _edited(deltas, **change, sequence=seq if not change else seq + 1)
    before, position = table._state, table.stream_position()
    ids, offsets = _probe()
    rows = table(ids, offsets)
    with pytest.raises(DeltaError, match=match):
        table.apply_delta(bad)
    assert table._state is before and table.stream_position() == position
    assert torch.equal(table(ids, offsets), rows)


def test_a_delta_of_another_dim_is_refused(stream):
    from dynamicemb.replication import DeltaFollower

    folder, _ = stream
    dims = {t.name: t.dim for t in CASE.tables}
    table = _table(dims={**dims, "t2": 16})
    with pytest.raises(
        ValueError, match="embedding_dim 4 differs from the inference table's dim 16"
    ):
        DeltaFollower(table, folder).poll()
    table, deltas = _followed(stream)
    other = InferenceEmbeddingTable(
        [InferenceTableConfig("t2", 16, ["f"], collection=c.COLLECTION)]
    )
    with pytest.raises(ValueError, match="dim 4, the inference table's is 16"):
        other.apply_delta(_edited(deltas, sequence=None))
    assert other.sizes() == {"t2": 0}


_SERVE = """
import sys, torch
from dynamicemb.inference import InferenceEmbeddingTable, InferenceTableConfig
from dynamicemb.replication import DeltaFollower
table = InferenceEmbeddingTable(
    [InferenceTableConfig(n, d, ["f_" + n]) for n, d in {dims!r}.items()], dtype=torch.int8)
applied = DeltaFollower(table, {folder!r}).poll()
ids = torch.arange(-5, 50).repeat(3)
out = table(ids, torch.tensor([0, 55, 110, 165]))
assert applied and out.abs().sum() > 0
training = ("dynamicemb.shard", "dynamicemb.storage", "dynamicemb.planner", "dynamicemb.admission",
            "dynamicemb.embedding.batched_tables", "dynamicemb.checkpoint.load",
            "dynamicemb.checkpoint.dump", "dynamicemb.replication.replay",
            "dynamicemb.replication.dump", "dynamicemb.replication.stream")
inside = tuple(t + "." for t in training)
print(sorted(m for m in sys.modules if m in training or m.startswith(inside)))
"""


def test_a_serving_process_imports_none_of_the_training_code(stream):
    folder, _ = stream
    dims = {t.name: t.dim for t in CASE.tables}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", _SERVE.format(dims=dims, folder=folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
