"""A training job with a frequency admitter publishes a delta after every
step; replicas follow it.

The job (two gloo ranks, FrequencyAdmissionStrategy with threshold 3, far
more distinct keys than its tables hold, erases at two steps) admits a key
once it has been seen three times; keys seen fewer times take no row. After
every delta, a replica at one rank (by key) and one of the job's own layout
(by slot) hold exactly the keys the job holds with its rows bit for bit.
Every key of every delta is one the job held after that step, and no key
the batches show fewer than three times over the whole job (it can never be
admitted) is in any delta or any replica.
"""

import dataclasses
import os

import pytest

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.replication import repl_harness as r
from tests.shard import shard_harness as h

THRESHOLD = 3
TRAIN_WORLD = 2


def _admitting(cs):
    tables = [dataclasses.replace(t, admit_threshold=THRESHOLD) for t in cs.tables]
    return dataclasses.replace(cs, name=cs.name + "_admission", tables=tables)


CASES = [
    _admitting(r.case("step_adam", S.STEP, "adam", tables=("t0", "t1"))),
    _admitting(r.case("ts_rowwise", S.TIMESTAMP, "rowwise_adagrad", dist_type="roundrobin")),
]


def _never_admitted(cs) -> dict[str, set[int]]:
    """Per table, the keys the job's batches hold fewer than THRESHOLD times
    over all steps and ranks."""
    sc = cs.scenario()
    seen: dict[str, dict[int, int]] = {t.name: {} for t in cs.tables}
    for step in range(r.STEPS):
        for rank in range(TRAIN_WORLD):
            batch = h.batch_for(sc, step, rank)
            for t in cs.tables:
                for keys, _ in batch[t.feature]:
                    for k in keys.tolist():
                        seen[t.name][k] = seen[t.name].get(k, 0) + 1
    return {n: {k for k, v in s.items() if v < THRESHOLD} for n, s in seen.items()}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("admission_stream"))
    trainer = h.run_world(r.train_and_publish, TRAIN_WORLD, CASES, folder)
    return folder, trainer


def _check_replicas(trainer, replicas, cases, world):
    for cs in cases:
        tr = [t[cs.name] for t in trainer]
        rp = [x[cs.name] for x in replicas]
        never = _never_admitted(cs)
        for step in range(r.STEPS):
            want = r.merge(tr, step)
            got = r.merge(rp, step)
            r.assert_replica_equals(got, want, cs.score_strategy, f"{cs.name} step {step}")
            r.assert_owned(got, world, cs.tables[0].dist_type)
            for name, t in got.items():
                assert not set(t["keys"].tolist()) & never[name], (cs.name, step, name)


def test_deltas_hold_only_admitted_keys(published):
    from dynamicemb.replication.stream import delta_path, list_deltas, read_delta

    folder, trainer = published
    for cs in CASES:
        never = _never_admitted(cs)
        assert all(len(v) > 20 for v in never.values()), cs.name  # many keys never get in
        tr = [t[cs.name] for t in trainer]
        path = os.path.join(folder, cs.name)
        seqs = list_deltas(path)
        assert len(seqs) == r.STEPS
        delta_keys = 0
        for step, seq in enumerate(seqs):
            _, deltas = read_delta(delta_path(path, seq))
            held = r.merge(tr, step)
            d = deltas[r.COLL]
            for name, keys in zip(d.table_names, d.keys):
                keys = set(keys.tolist())
                delta_keys += len(keys)
                assert keys <= set(held[name]["keys"].tolist()), (cs.name, step, name)
                assert not keys & never[name], (cs.name, step, name)
        assert delta_keys > 0, cs.name
        # The job admitted keys and holds some at the end.
        last = r.merge(tr, r.STEPS - 1)
        assert all(t["keys"].numel() > 0 for t in last.values()), cs.name


def test_a_replica_at_one_rank_follows_by_key(published):
    folder, trainer = published
    cases = [r.replica_case(cs) for cs in CASES]
    replicas = h.run_world(r.follow, 1, cases, folder, "key")
    _check_replicas(trainer, replicas, cases, 1)


def test_a_replica_of_the_same_layout_follows_by_slot(published):
    folder, trainer = published
    replicas = h.run_world(r.follow, TRAIN_WORLD, CASES, folder, "slot")
    _check_replicas(trainer, replicas, CASES, TRAIN_WORLD)
    r.assert_same_slots(trainer, replicas, CASES, TRAIN_WORLD)
