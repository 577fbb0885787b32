"""Admission counters in checkpoints: a model with FrequencyAdmissionStrategy
dumps its counters with its rows, and a load puts every counted key on the
rank that owns it, at any world size.

The strongest check is continuation: two gloo ranks train, dump and go on
training; a fresh model loads the checkpoint and trains the same steps. After
every step both hold the same keys with the same rows, optimizer state and
scores, bit for bit, and the same counters: admission admitted the same keys
at the same steps. A model that loaded the rows but not the counters does
not (so the counters are what makes it so). Counters are read from the fused
counter's hash table, not through the checkpoint code.
"""

import os
import shutil
import warnings

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
THRESHOLD = 3
CASE = c.Case(
    "admission",
    "ec",
    [
        T("t0", 40, 4, dist_type="roundrobin", admit_threshold=THRESHOLD),
        T("t1", 40, 4, dist_type="hash_roundrobin", admit_threshold=THRESHOLD),
        T("t2", 40, 4, dist_type="continuous", admit_threshold=2),
    ],
    optimizer="adam",
    score_strategy=S.STEP,
    steps=3,
    key_range=(0, 80),
    batch_size=4,
    max_length=5,
)
# The same tables without admission.
PLAIN = c.Case(
    CASE.name,
    "ec",
    [T(t.name, 40, 4, dist_type=t.dist_type) for t in CASE.tables],
    optimizer="adam",
    score_strategy=S.STEP,
)
MORE = 4  # steps trained after the dump


def _owner(keys: torch.Tensor, world: int, name: str) -> torch.Tensor:
    from dynamicemb.shard import route_keys

    spec = next(t for t in CASE.tables if t.name == name)
    return route_keys(keys, world, spec.dist_type, spec.num_embeddings)


def _clear_counters(model) -> None:
    held = c.counters(model)
    for k in c.kernels(model):
        counter = k.emb_module.admitter.state()
        for t, name in enumerate(k.table_names):
            keys = held[name]["keys"]
            counter.erase(keys, torch.full_like(keys, t))
    assert all(v["keys"].numel() == 0 for v in c.counters(model).values())


def _continue(model, rank):
    trace = []
    for i in range(MORE):
        c.train(model, CASE, rank, steps=1, first=CASE.steps + i)
        trace.append({"tables": c.contents(model), "counters": c.counters(model)})
    return trace


def _continuation_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad

    path = os.path.join(root, "w2")
    model = c.build(CASE, world)
    c.train(model, CASE, rank)
    DynamicEmbDump(path, model, optim=True)
    dumped = {"tables": c.contents(model), "counters": c.counters(model)}
    straight = _continue(model, rank)
    resumed = c.build(CASE, world)
    DynamicEmbLoad(path, resumed, optim=True)
    loaded = {"tables": c.contents(resumed), "counters": c.counters(resumed)}
    after_load = _continue(resumed, rank)
    forgetful = c.build(CASE, world)
    DynamicEmbLoad(path, forgetful, optim=True)
    _clear_counters(forgetful)
    without_counters = _continue(forgetful, rank)
    return {
        "dumped": dumped,
        "loaded": loaded,
        "straight": straight,
        "resumed": after_load,
        "without_counters": without_counters,
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("adm"))
    return root, h.run_world(_continuation_world, 2, root)


def test_dump_holds_counters_and_meta_describes_them(two_ranks):
    import json

    root, per_rank = two_ranks
    want = c.merge_counters([r["dumped"]["counters"] for r in per_rank])
    folder = os.path.join(root, "w2", c.COLLECTION)
    for name, w in want.items():
        assert w["keys"].numel() > 0, name  # keys were waiting when it dumped
        meta = json.load(open(os.path.join(folder, f"{name}_meta.json")))
        desc = meta["admission_counter"]
        threshold = next(t.admit_threshold for t in CASE.tables if t.name == name)
        assert desc == {
            "counter": "MultiTableKVCounter",
            "key_dtype": "int64",
            "count_dtype": "int64",
            "entries": w["keys"].numel(),
            "strategy": "FrequencyAdmissionStrategy",
            "threshold": threshold,
            "capacity": 1024,
            "bucket_capacity": 128,
        }
        assert int(w["counts"].max()) < threshold
        for shard in meta["shards"]:
            assert sorted(shard["files"]) == sorted(
                ["keys", "values", "opt_values", "scores", "counter_keys", "counter_values"]
            )


def test_load_restores_counters_on_their_ranks(two_ranks):
    _, per_rank = two_ranks
    for what in ("tables", "counters"):
        for r in per_rank:
            if what == "tables":
                c.assert_same_tables(r["loaded"][what], r["dumped"][what], what="loaded")
            else:
                c.assert_same_counters(r["loaded"][what], r["dumped"][what], what="loaded")


def test_training_after_a_load_admits_as_without_the_interruption(two_ranks):
    _check_continuation(two_ranks[1])


def _check_continuation(per_rank):
    differs = 0
    for r in per_rank:
        for step, (a, b, f) in enumerate(zip(r["straight"], r["resumed"], r["without_counters"])):
            what = f"step {CASE.steps + step}"
            c.assert_same_tables(b["tables"], a["tables"], what=what)
            c.assert_same_counters(b["counters"], a["counters"], what=what)
            same = all(
                torch.equal(f["tables"][n]["keys"], a["tables"][n]["keys"]) for n in a["tables"]
            )
            differs += not same
    # Forgetting the counters changes which keys get in.
    assert differs > 0


@pytest.mark.multigpu
def test_nccl_continuation_at_two_gpus(tmp_path):
    """The same on two GPUs (NCCL): the CUDA counter and lookup kernels."""
    per_rank = h.run_world(_continuation_world, 2, str(tmp_path), device_type="cuda")
    for r in per_rank:
        c.assert_same_counters(r["loaded"]["counters"], r["dumped"]["counters"], what="loaded")
    _check_continuation(per_rank)


def _reshard_world(rank, world, root, source):
    from dynamicemb import DynamicEmbLoad

    model = c.build(CASE, world)
    DynamicEmbLoad(os.path.join(root, source), model, optim=True)
    return {"tables": c.contents(model), "counters": c.counters(model)}


def _dump_one(rank, world, root):
    from dynamicemb import DynamicEmbDump

    model = c.build(CASE, world)
    c.train(model, CASE, rank, steps=4)
    DynamicEmbDump(os.path.join(root, "w1"), model, optim=True)
    return {"tables": c.contents(model), "counters": c.counters(model)}


def _check_resharded(want_counters, want_tables, results, world, what):
    got = c.merge_counters([r["counters"] for r in results])
    for name, w in want_counters.items():
        g = got[name]
        assert torch.equal(g["keys"], w["keys"]), (what, name)
        assert torch.equal(g["counts"], w["counts"]), (what, name)
        assert torch.equal(g["rank"], _owner(g["keys"], world, name)), (what, name)
    tables = c.merge([r["tables"] for r in results])
    for name, w in want_tables.items():
        c.assert_same_tables({name: tables[name]}, {name: w}, what=what)


def test_reshard_two_ranks_to_one(two_ranks):
    root, per_rank = two_ranks
    want_c = c.merge_counters([r["dumped"]["counters"] for r in per_rank])
    want_t = c.merge([r["dumped"]["tables"] for r in per_rank])
    results = h.run_world(_reshard_world, 1, root, "w2")
    _check_resharded(want_c, want_t, results, 1, "2 -> 1")


def test_reshard_one_rank_to_three(tmp_path):
    root = str(tmp_path)
    (dumped,) = h.run_world(_dump_one, 1, root)
    want_c = c.merge_counters([dumped["counters"]])
    assert all(w["keys"].numel() > 3 for w in want_c.values())
    results = h.run_world(_reshard_world, 3, root, "w1")
    _check_resharded(want_c, c.merge([dumped["tables"]]), results, 3, "1 -> 3")
    # Every rank got counted keys of the hashed table.
    got = c.merge_counters([r["counters"] for r in results])
    assert sorted(set(got["t1"]["rank"].tolist())) == [0, 1, 2]


# ------------------------------------------------- refusals and mismatches --


def _counter_file(path: str, table: str, kind: str) -> str:
    folder = os.path.join(path, c.COLLECTION)
    (name,) = [n for n in os.listdir(folder) if n.startswith(f"{table}_{kind}.")]
    return os.path.join(folder, name)


def _checks_world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.admission import MultiTableKVCounter
    from dynamicemb.checkpoint import CheckpointError

    model = c.build(CASE, world)
    c.train(model, CASE, rank)
    good = os.path.join(root, "good")
    DynamicEmbDump(good, model, optim=True)
    want_t, want_c = c.contents(model), c.counters(model)
    target = c.build(CASE, world)
    c.train(target, CASE, rank, first=40)  # other rows and counts than the checkpoint's
    before_t, before_c = c.contents(target), c.counters(target)
    assert any(before_c[n]["keys"].numel() for n in before_c)

    check = c.Checks()

    def refused(path, exc, match):
        try:
            DynamicEmbLoad(path, target, optim=True)
        except exc as e:
            assert match in str(e), f"message {e!r} lacks {match!r}"
        else:
            raise AssertionError("the load did not fail")
        c.assert_same_tables(c.contents(target), before_t, what="rows after the failed load")
        c.assert_same_counters(c.counters(target), before_c, what="counters after the failed load")

    def damaged(name, table, kind, how):
        p = shutil.copytree(good, os.path.join(root, name))
        f = _counter_file(p, table, kind)
        data = bytearray(open(f, "rb").read())
        if how == "flip":
            data[len(data) // 2] ^= 0x04
        else:
            data = data[:-8]
        open(f, "wb").write(bytes(data))
        return p

    @check("corrupted_counter_values")
    def _():
        refused(damaged("flip", "t1", "counter_values", "flip"), CheckpointError, "is corrupted")

    @check("corrupted_counter_keys")
    def _():
        refused(damaged("flipk", "t2", "counter_keys", "flip"), CheckpointError, "is corrupted")

    @check("truncated_counter_keys")
    def _():
        refused(damaged("trunc", "t0", "counter_keys", "trunc"), CheckpointError, "truncated")

    @check("missing_counter_file")
    def _():
        p = shutil.copytree(good, os.path.join(root, "missing"))
        os.remove(_counter_file(p, "t0", "counter_values"))
        refused(p, CheckpointError, "does not exist")

    @check("failure_loading_a_counter_restores_everything")
    def _():
        # The second table's counter fails after the first table's loaded.
        with c.failing_call(MultiTableKVCounter, "load", 2, "injected counter failure") as calls:
            refused(good, RuntimeError, "injected counter failure")
        assert len(calls) > 2  # the rollback loaded the snapshots back

    @check("good_checkpoint_loads_after_the_refusals")
    def _():
        DynamicEmbLoad(good, target, optim=True)
        c.assert_same_tables(c.contents(target), want_t)
        c.assert_same_counters(c.counters(target), want_c)

    @check("no_counter_files_empty_the_counters")
    def _():
        plain = c.build(PLAIN, world)
        c.train(plain, PLAIN, rank)
        p = os.path.join(root, "plain")
        DynamicEmbDump(p, plain, optim=True)
        fresh = c.build(CASE, world)
        c.train(fresh, CASE, rank, first=40)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            DynamicEmbLoad(p, fresh, optim=True)
        messages = [str(w.message) for w in caught]
        assert sum("holds no admission counter" in m for m in messages) == 3, messages
        c.assert_same_tables(c.contents(fresh), c.contents(plain))
        assert all(v["keys"].numel() == 0 for v in c.counters(fresh).values())

    @check("counter_files_into_a_model_without_admission")
    def _():
        plain = c.build(PLAIN, world)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            DynamicEmbLoad(good, plain, optim=True)
        messages = [str(w.message) for w in caught]
        assert sum("ignoring the counter" in m for m in messages) == 3, messages
        c.assert_same_tables(c.contents(plain), want_t)

    return check.results


CHECKS = [
    "corrupted_counter_values",
    "corrupted_counter_keys",
    "truncated_counter_keys",
    "missing_counter_file",
    "failure_loading_a_counter_restores_everything",
    "good_checkpoint_loads_after_the_refusals",
    "no_counter_files_empty_the_counters",
    "counter_files_into_a_model_without_admission",
]


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    return c.run_checks(_checks_world, str(tmp_path_factory.mktemp("adm_bad")), CHECKS)


@pytest.mark.parametrize("name", CHECKS)
def test_check(checks, name):
    assert checks[name] == "ok", checks[name]
