"""incremental_dump, replay_increment, get_score and the removed-key streams
as the spec states them, over two gloo ranks, through the spec's names only
(``erase_keys``, which the spec leaves unnamed, is ``dynamicemb.replication``'s).

Every delta is gathered over the group (``incremental_dump(..., pg)``), so
every rank replays the whole delta and keeps the keys it owns; a replica is
the source's configuration, built fresh.
"""

import torch
import torch.distributed as dist

from tests.spec import spec_model as sm

COLL = sm.COLLECTION


def _options(**kwargs):
    from dynamicemb import DynamicEmbTableOptions

    return DynamicEmbTableOptions(**kwargs)


def _next_threshold(deltas):
    """The spec's threshold of the next dump: each table's current_score."""
    return {
        c: {r.table_names[i]: r.meta[i]["current_score"] for i in range(len(r.table_names))}
        for c, r in deltas.items()
    }


def _table(deltas, name):
    """One table of a delta of the model's collection, sorted by key."""
    delta = deltas[COLL]
    i = delta.table_names.index(name)
    order = torch.argsort(delta.keys[i])

    def col(x):
        return None if x is None else x[order]

    return {
        "keys": delta.keys[i][order],
        "values": delta.values[i][order],
        "optimizer_states": col(delta.optimizer_states[i]),
        "scores": delta.scores[i][order],
        "slot_index": delta.meta[i]["slot_index"][order],
        "erased_keys": delta.erased_keys[i],
        "evicted_keys": delta.evicted_keys[i],
    }


def _held(rows: torch.Tensor) -> torch.Tensor:
    """Which looked-up keys a table holds: their rows are not the eval
    initializer's zeros."""
    return rows.abs().sum(1) > 0


# ---------------------------------------------------------- import paths --


def test_the_spec_import_paths():
    from dynamicemb import DeltaDumpResult, pop_erased_keys, pop_evicted_keys, replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump, set_score

    for fn in (pop_erased_keys, pop_evicted_keys, replay_increment, get_score, set_score):
        assert callable(fn)
    assert callable(incremental_dump) and isinstance(DeltaDumpResult, type)


# ----------------------------------------------------------- NO_EVICTION --


def _no_eviction_world(rank, world):
    from dynamicemb import DeltaDumpResult, DynamicEmbScoreStrategy, replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump

    # Room for every key without growing (a grown table's layout differs
    # from a fresh replica's, which a replay by slot refuses).
    tables = [sm.Table("t", _options(score_strategy=DynamicEmbScoreStrategy.NO_EVICTION))]
    src, rep = sm.build(tables), sm.build(tables)
    keys = torch.arange(0, 200)
    out = {}
    threshold = get_score(src)
    sm.train(src, tables, range(3), rank)
    first = incremental_dump(src, threshold, dist.group.WORLD)
    out["is_delta"] = isinstance(first[COLL], DeltaDumpResult)
    replay_increment(rep, first)
    out["first"] = (sm.lookup(src, tables, keys)["t"], sm.lookup(rep, tables, keys)["t"])
    # The rows added since: a NO_EVICTION score is the key's row.
    sm.train(src, tables, range(3, 6), rank, low=100, high=164)
    added = incremental_dump(src, _next_threshold(first), dist.group.WORLD)
    out["added_keys"] = _table(added, "t")["keys"]
    replay_increment(rep, added)
    everything = incremental_dump(src, 0, dist.group.WORLD)
    replay_increment(rep, everything)
    out["last"] = (sm.lookup(src, tables, keys)["t"], sm.lookup(rep, tables, keys)["t"])
    out["source"] = _table(everything, "t")
    out["replica"] = _table(incremental_dump(rep, 0, dist.group.WORLD), "t")
    return out


def test_no_eviction_tables_replicate_exactly():
    tables = [sm.Table("t", None)]
    added = sm.seen_keys(tables, range(3, 6), 2, low=100, high=164)["t"]
    for out in sm.run_world(_no_eviction_world, 2):
        assert out["is_delta"]
        for stage in ("first", "last"):
            src, rep = out[stage]
            assert _held(src).sum() > 0
            assert torch.equal(src, rep), stage
        assert out["added_keys"].tolist() == sorted(added)
        # Layout-identical: every key at the source's slot and row.
        for column in ("keys", "values", "slot_index", "scores"):
            assert torch.equal(out["replica"][column], out["source"][column]), column


# -------------------------------------------------------- ReplayContent --


def _content_world(rank, world):
    from dynamicemb import DynamicEmbScoreStrategy, ReplayContent, replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump

    # STEP: scores are absolute steps, carried verbatim.
    tables = [sm.Table("t", _options(score_strategy=DynamicEmbScoreStrategy.STEP))]
    src = sm.build(tables)
    sm.train(src, tables, range(3), rank)
    full = incremental_dump(src, 0, dist.group.WORLD)
    out = {"source": _table(full, "t")}
    for content in (ReplayContent.SCORE, ReplayContent.OPTIMIZER_STATE):
        rep = sm.build(tables)
        fresh = get_score(rep)[COLL]["t"]
        replay_increment(rep, full, content)
        out[content.name] = dict(
            _table(incremental_dump(rep, 0, dist.group.WORLD), "t"), fresh=fresh
        )
    return out


def test_replay_content_score_alone_and_optimizer_state_alone():
    for out in sm.run_world(_content_world, 2):
        src = out["source"]
        assert src["optimizer_states"].abs().sum() > 0
        assert len(set(src["scores"].reshape(-1).tolist())) > 1
        for name in ("SCORE", "OPTIMIZER_STATE"):
            rep = out[name]
            assert torch.equal(rep["keys"], src["keys"]), name
            assert torch.equal(rep["values"], src["values"]), name  # the embedding always travels
        # SCORE: the source's scores; every row got the initial (Adam: zero) state.
        assert torch.equal(out["SCORE"]["scores"], src["scores"])
        assert torch.equal(
            out["SCORE"]["optimizer_states"], torch.zeros_like(src["optimizer_states"])
        )
        # OPTIMIZER_STATE: the source's state; scored as if just inserted here.
        rep = out["OPTIMIZER_STATE"]
        assert torch.equal(rep["optimizer_states"], src["optimizer_states"])
        assert torch.equal(rep["scores"], torch.full_like(src["scores"], rep["fresh"]))


# ----------------------------------------------- evictions, by slot, DISCARD --


def _discard_world(rank, world):
    from dynamicemb import replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump

    # One bucket of 16 slots per rank; evicted keys are discarded (the default).
    tables = [sm.Table("t", _options(bucket_capacity=16), num_embeddings=32)]
    src, rep = sm.build(tables), sm.build(tables)
    keys = torch.cat([torch.arange(0, 8), torch.arange(100, 200)])
    threshold = get_score(src)
    sm.train(src, tables, range(2), rank, high=8)
    first = incremental_dump(src, threshold, dist.group.WORLD)
    replay_increment(rep, first)
    before = sm.lookup(rep, tables, keys)["t"]
    sm.train(src, tables, range(2, 5), rank, low=100, high=200)
    second = incremental_dump(src, _next_threshold(first), dist.group.WORLD)
    stats = replay_increment(rep, second)[COLL]["t"]
    return {
        "evicted_keys": second[COLL].evicted_keys[0],
        "before": before,
        "source": sm.lookup(src, tables, keys)["t"],
        "replica": sm.lookup(rep, tables, keys)["t"],
        "erased": stats.erased,
        "source_layout": _table(incremental_dump(src, 0, dist.group.WORLD), "t"),
        "replica_layout": _table(incremental_dump(rep, 0, dist.group.WORLD), "t"),
    }


def test_replay_by_slot_overwrites_the_keys_a_discarding_source_evicted():
    for out in sm.run_world(_discard_world, 2):
        assert out["evicted_keys"] is None  # DISCARD: the delta names no eviction
        assert out["erased"] == 0
        old = slice(0, 8)
        assert _held(out["before"][old]).all()
        # The source evicted old keys for new ones: the replica no longer holds
        # them either, the keys that took their slots overwrote them.
        assert not _held(out["source"][old]).all()
        assert torch.equal(out["replica"], out["source"])
        # Every key at the slot it holds in the source.
        for column in ("keys", "slot_index"):
            assert torch.equal(out["replica_layout"][column], out["source_layout"][column])


# ---------------------------------------------------- ReplayStats.erased --


def _erased_world(rank, world, erased):
    from dynamicemb import pop_erased_keys, replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump
    from dynamicemb.replication import erase_keys

    tables = [sm.Table("t", _options())]
    src, rep = sm.build(tables), sm.build(tables)
    threshold = get_score(src)
    sm.train(src, tables, range(2), rank)
    first = incremental_dump(src, threshold, dist.group.WORLD)
    replay_increment(rep, first)
    # Keys the replica holds, and one it never held: trained and erased
    # between the two dumps.
    erase_keys(src, {COLL: {"t": torch.tensor(erased)}})
    sm.train_on(src, tables, {"t": torch.tensor([1000])})
    erase_keys(src, {COLL: {"t": torch.tensor([1000])}})
    second = incremental_dump(src, _next_threshold(first), dist.group.WORLD)
    stats = replay_increment(rep, second)[COLL]["t"]
    keys = torch.tensor(erased + [1000])
    return {
        "erased": stats.erased,
        "delta_erased": second[COLL].erased_keys[0],
        "source": sm.lookup(src, tables, keys)["t"],
        "replica": sm.lookup(rep, tables, keys)["t"],
        "popped": pop_erased_keys(src),  # drained by the dump
    }


def test_replay_stats_erased_counts_the_keys_really_removed():
    tables = [sm.Table("t", None)]
    erased = sorted(sm.seen_keys(tables, range(2), 2)["t"])[:5]
    outs = sm.run_world(_erased_world, 2, erased)
    assert sum(out["erased"] for out in outs) == len(erased)
    for out in outs:
        assert sorted(out["delta_erased"].tolist()) == erased + [1000]
        assert not _held(out["source"]).any()
        assert torch.equal(out["replica"], out["source"])
        assert out["popped"][COLL]["t"].numel() == 0


# ------------------------------------------------- get_score, LFU / NO_EVICTION --


def _get_score_world(rank, world):
    from dynamicemb import DynamicEmbScoreStrategy as S
    from dynamicemb.incremental_dump import get_score, incremental_dump

    tables = [
        sm.Table("lfu", _options(score_strategy=S.LFU)),
        sm.Table("ne", _options(score_strategy=S.NO_EVICTION)),
    ]
    model = sm.build(tables)
    sm.train(model, tables, range(2), rank)
    threshold = get_score(model)
    sm.train(model, tables, range(2, 4), rank, low=100, high=164)
    delta = incremental_dump(model, threshold, dist.group.WORLD)
    return {
        "threshold": threshold,
        "lfu": _table(delta, "lfu"),
        "ne": _table(delta, "ne"),
    }


def test_get_score_of_lfu_and_no_eviction_tables_thresholds_a_later_dump():
    tables = [sm.Table("lfu", None), sm.Table("ne", None)]
    early = sm.seen_keys(tables, range(2), 2)
    late = sm.seen_keys(tables, range(2, 4), 2, low=100, high=164)
    for out in sm.run_world(_get_score_world, 2):
        scores = out["threshold"][COLL]
        assert all(isinstance(scores[name], int) for name in ("lfu", "ne")), scores
        # LFU: every key whose frequency is at least the threshold, all of them.
        lfu = out["lfu"]
        assert lfu["keys"].tolist() == sorted(early["lfu"] | late["lfu"])
        assert bool((lfu["scores"] >= scores["lfu"]).all())
        # NO_EVICTION: the rows handed out since, i.e. the keys new since.
        assert out["ne"]["keys"].tolist() == sorted(late["ne"] - early["ne"])


# ------------------------------------------------------- training=False --


def _serving_world(rank, world):
    from dynamicemb import replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump

    trained = [sm.Table("t", _options())]
    serving = [sm.Table("t", _options(training=False))]
    src, rep = sm.build(trained), sm.build(serving)
    threshold = get_score(src)
    sm.train(src, trained, range(3), rank)
    delta = incremental_dump(src, threshold, dist.group.WORLD)
    replay_increment(rep, delta)
    keys = torch.arange(0, 64)
    return {
        "source_state": delta[COLL].optimizer_states[0],
        "replica_state": incremental_dump(rep, 0, dist.group.WORLD)[COLL].optimizer_states[0],
        "source": sm.lookup(src, trained, keys)["t"],
        "replica": sm.lookup(rep, serving, keys)["t"],
    }


def test_a_training_false_replica_serves_and_keeps_no_optimizer_state():
    for out in sm.run_world(_serving_world, 2):
        assert out["source_state"] is not None and out["source_state"].numel() > 0
        assert out["replica_state"] is None  # no per-row optimizer state
        assert _held(out["source"]).any()
        assert torch.equal(out["replica"], out["source"])


# ------------------------------------------------------ removed-key streams --


def _pop_world(rank, world):
    from dynamicemb import EvictedItemMode, pop_erased_keys, pop_evicted_keys
    from dynamicemb.replication import erase_keys

    tables = [
        sm.Table(
            "kept",
            _options(bucket_capacity=16, evicted_item_mode=EvictedItemMode.RETAIN_KEY),
            num_embeddings=32,
        ),
        sm.Table("dropped", _options(bucket_capacity=16), num_embeddings=32),
    ]
    model = sm.build(tables)
    sm.train(model, tables, range(5), rank, high=100)
    keys = torch.arange(0, 100)
    rows = sm.lookup(model, tables, keys)
    evicted = pop_evicted_keys(model, pg=dist.group.WORLD)
    again = pop_evicted_keys(model, pg=dist.group.WORLD)
    gone = keys[_held(rows["dropped"])][:1]
    erase_keys(model, {COLL: {"dropped": gone}})
    return {
        "held": {name: keys[_held(r)] for name, r in rows.items()},
        "evicted": evicted,
        "again": again,
        "gone": gone,
        "erased": pop_erased_keys(model, pg=dist.group.WORLD),
        "erased_again": pop_erased_keys(model, pg=dist.group.WORLD),
    }


def test_pop_evicted_keys_and_pop_erased_keys_read_and_clear():
    tables = [sm.Table("kept", None), sm.Table("dropped", None)]
    seen = sm.seen_keys(tables, range(5), 2, high=100)
    for out in sm.run_world(_pop_world, 2):
        # Only the table retaining its evictions is there.
        assert set(out["evicted"]) == {COLL} and set(out["evicted"][COLL]) == {"kept"}
        evicted = set(out["evicted"][COLL]["kept"].tolist())
        held = set(out["held"]["kept"].tolist())
        assert seen["kept"] - held <= evicted <= seen["kept"]
        assert seen["kept"] - held
        assert out["again"][COLL]["kept"].numel() == 0
        # Every table is in the erased stream; the erased key in its own.
        erased = out["erased"][COLL]
        assert set(erased) == {"kept", "dropped"}
        assert erased["kept"].numel() == 0
        assert torch.equal(erased["dropped"], out["gone"])
        assert all(k.numel() == 0 for k in out["erased_again"][COLL].values())


# ------------------------------------------- per-rank deltas, on every rank --


def _per_rank_world(rank, world):
    from dynamicemb import replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump

    tables = [sm.Table("t", _options())]
    src, rep = sm.build(tables), sm.build(tables)
    threshold = get_score(src)
    rounds = []
    for steps, order in ((range(3), [0, 1]), (range(3, 5), [1, 0])):
        sm.train(src, tables, steps, rank)
        mine = incremental_dump(src, threshold)  # pg=None: this rank's keys only
        threshold = _next_threshold(mine)
        every = [None] * world
        dist.all_gather_object(every, mine)
        # Every rank's delta on every rank, in both orders.
        stats = {q: replay_increment(rep, every[q])[COLL]["t"] for q in order}
        rounds.append(
            {
                q: (every[q][COLL].keys[0].numel(), stats[q].upserted, stats[q].skipped)
                for q in order
            }
        )
    keys = torch.arange(0, 64)
    return {
        "rounds": rounds,
        "source": sm.lookup(src, tables, keys)["t"],
        "replica": sm.lookup(rep, tables, keys)["t"],
    }


def test_a_per_rank_delta_replayed_on_another_rank_skips_every_key():
    """The spec: "replaying it on another rank is not an error, every key
    simply belongs to someone else and is skipped, which ReplayStats.skipped
    reports"."""
    for rank, out in enumerate(sm.run_world(_per_rank_world, 2)):
        for per_rank in out["rounds"]:
            for q, (n, upserted, skipped) in per_rank.items():
                assert n > 0
                assert (upserted, skipped) == ((n, 0) if q == rank else (0, n)), (rank, q)
        assert _held(out["source"]).any()
        assert torch.equal(out["replica"], out["source"])


# ---------------------------------- any well-formed delta, any dump skipped --

# The meta fields the spec names (no sequence, no checksum).
SPEC_META = (
    "current_score",
    "slot_index",
    "current_capacity",
    "row_capacity",
    "bucket_capacity",
    "num_scores",
    "world_size",
    "table_options",
)


def _edited(deltas, keep=None, meta=SPEC_META):
    """A delta built from another's columns (rows ``keep(keys)`` only), with
    the meta fields ``meta``."""
    from dynamicemb import DeltaDumpResult

    out = {}
    for coll, d in deltas.items():
        e = DeltaDumpResult()
        for i in range(len(d)):
            entry = d.table(i)
            rows = torch.ones_like(entry["keys"], dtype=torch.bool)
            if keep is not None:
                rows = keep(entry["keys"])
            cut = dict(entry)
            for c in ("keys", "values", "optimizer_states", "scores"):
                cut[c] = None if entry[c] is None else entry[c][rows]
            cut["meta"] = {k: entry["meta"][k] for k in meta}
            cut["meta"]["slot_index"] = entry["meta"]["slot_index"][rows]
            e.append(cut)
        out[coll] = e
    return out


def _any_delta_world(rank, world):
    from dynamicemb import replay_increment
    from dynamicemb.incremental_dump import get_score, incremental_dump

    tables = [sm.Table("t", _options())]
    src = sm.build(tables)
    rep, hand, part = sm.build(tables), sm.build(tables), sm.build(tables)
    threshold = get_score(src)
    sm.train(src, tables, range(2), rank)
    first = incremental_dump(src, threshold, dist.group.WORLD)
    replay_increment(rep, first)
    replay_increment(hand, _edited(first))
    replay_increment(part, first)
    later = _next_threshold(first)
    sm.train(src, tables, range(2, 4), rank)
    incremental_dump(src, later, dist.group.WORLD)  # a dump nobody replays
    sm.train(src, tables, range(4, 6), rank)
    # Every key whose score is at or above the threshold: both intervals.
    third = incremental_dump(src, later, dist.group.WORLD)
    keys = torch.arange(0, 64)
    out = {"upserted": replay_increment(rep, third)[COLL]["t"].upserted}
    replay_increment(hand, _edited(third))

    def even(k):
        return k % 2 == 0

    # Filtered but still carrying the dump's checksum: refused, unchanged.
    before = sm.lookup(part, tables, keys)["t"]
    stale = _edited(third, even, SPEC_META + ("sequence", "checksum"))
    try:
        replay_increment(part, stale)
        out["stale"] = "applied"
    except ValueError as e:  # the checksum refusal (a DeltaError)
        out["stale"] = str(e)
    out["unchanged"] = torch.equal(sm.lookup(part, tables, keys)["t"], before)
    replay_increment(part, _edited(third, even))
    out.update(
        keys=keys,
        third=third[COLL].keys[0],
        source=sm.lookup(src, tables, keys)["t"],
        replica=sm.lookup(rep, tables, keys)["t"],
        hand=sm.lookup(hand, tables, keys)["t"],
        part=sm.lookup(part, tables, keys)["t"],
        first_part=before,
    )
    return out


def test_replay_increment_applies_any_well_formed_delta():
    """A dump nobody replays does not keep the next from applying; a delta
    built by hand (the spec's fields only) or filtered by key applies; a
    checksum that is present and wrong is refused."""
    for out in sm.run_world(_any_delta_world, 2):
        assert out["upserted"] > 0
        assert _held(out["source"]).any()
        assert torch.equal(out["replica"], out["source"])
        assert torch.equal(out["hand"], out["source"])
        assert "corrupted" in out["stale"] and out["unchanged"]
        # The filtered replica: the even keys of the third delta as the
        # source holds them, every other key as the first delta left it.
        even = torch.isin(out["keys"], out["third"]) & (out["keys"] % 2 == 0)
        assert even.any()
        assert torch.equal(out["part"][even], out["source"][even])
        assert torch.equal(out["part"][~even], out["first_part"][~even])
