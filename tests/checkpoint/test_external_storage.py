"""Tables whose rows live in an external ``Storage``: they train as the same
tables without it do, a checkpoint dumps and loads them through the storage's
own interface (every key, its embedding, optimizer state and scores), a
checkpoint moves between a model with and one without the storage, and their
metrics publish what dynamicemb knows of them; what needs a dynamicemb hash
table (incremental dumps) is refused with an error naming the operation, and
changes nothing; their scores are unavailable (None)."""

import dataclasses
import os

import pytest
import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
DIM = 4
CACHE_ROWS = 48


def _case(caching: bool | None) -> c.Case:
    """The case with an external storage (``caching``: with a device cache
    in front of it), or, ``caching`` None, the same tables without one."""
    from tests.storage.py_dict_storage import PyDictStorage

    case = c.Case(
        "plain" if caching is None else f"external_{'cache' if caching else 'only'}",
        "ec",
        [T("t0", 64, DIM, dist_type="roundrobin"), T("t1", 48, DIM, dist_type="hash_roundrobin")],
        optimizer="adam",
        steps=4,
        key_range=(-20, 200),
        batch_size=6,
    )
    if caching is None:
        return case
    # Adam: 3 * DIM float32 per row; the cache holds CACHE_ROWS of them.
    options = dict(
        external_storage=PyDictStorage,
        caching=caching,
        local_hbm_for_values=CACHE_ROWS * 3 * DIM * 4,
    )
    return dataclasses.replace(case, options=options)


def _rows(tables):
    """keys, embeddings and optimizer state of every table (scores are the
    storage's own: an external storage scores the rows handed to it)."""
    return {n: {f: t[f] for f in ("keys", "emb", "opt")} for n, t in tables.items()}


def _assert_same_rows(got, want, what):
    assert sorted(got) == sorted(want), what
    for name in want:
        for f in ("keys", "emb", "opt"):
            assert torch.equal(got[name][f], want[name][f]), f"{what} {name}: {f} differ"


def _metrics(model):
    """{instrument: {table: value}} of one collection of ``model``'s figures."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from dynamicemb.metrics import TABLE, instrument

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        instrument(model, meter_provider=provider)
        out = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = {
                        p.attributes[TABLE]: p.value
                        for p in m.data.data_points
                        if "dynamicemb.memory.type" not in p.attributes
                    }
        return out
    finally:
        provider.shutdown()


def _external_world(rank, world, root, caching):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.replication import get_score, incremental_dump

    case, plain = _case(caching), _case(None)
    model, reference = c.build(case, world), c.build(plain, world)
    c.train(model, case, rank)
    c.train(reference, plain, rank)
    trained = c.contents(model)
    assert all(trained[n]["keys"].numel() for n in trained)
    # The storage changes where rows live, not what training makes of them.
    _assert_same_rows(trained, _rows(c.contents(reference)), "trained")

    path = os.path.join(root, case.name)
    DynamicEmbDump(path, model, optim=True)
    fresh = c.build(case, world)
    c.train(fresh, case, rank, steps=1, first=50)  # keys the load must remove
    DynamicEmbLoad(path, fresh, optim=True)
    c.assert_same_tables(c.contents(fresh), trained, what="loaded")
    # The checkpoint loads into the model without external storage, and that
    # model's checkpoint into one with it.
    into_plain = c.build(plain, world)
    DynamicEmbLoad(path, into_plain, optim=True)
    _assert_same_rows(_rows(c.contents(into_plain)), trained, "loaded without storage")
    plain_path = os.path.join(root, f"{case.name}_plain")
    DynamicEmbDump(plain_path, reference, optim=True)
    from_plain = c.build(case, world)
    DynamicEmbLoad(plain_path, from_plain, optim=True)
    _assert_same_rows(_rows(c.contents(from_plain)), trained, "loaded from without storage")
    # Loaded with their optimizer state, all train on alike.
    for m, cs in ((fresh, case), (into_plain, plain), (from_plain, case), (reference, plain)):
        c.train(m, cs, rank, steps=2, first=10)
    after = _rows(c.contents(reference))
    for what, m in (("fresh", fresh), ("into_plain", into_plain), ("from_plain", from_plain)):
        _assert_same_rows(_rows(c.contents(m)), after, f"trained after loading ({what})")

    out = {"metrics": _metrics(fresh), "held": {n: t["keys"].numel() for n, t in after.items()}}
    (kernel,) = c.kernels(fresh)
    storage = kernel.emb_module.storage.backing.storage  # the PyDictStorage
    out["capacity"] = {n: storage.capacity(t) for t, n in enumerate(kernel.table_names)}
    before = c.contents(fresh)
    out["scores"] = get_score(fresh)
    refused = {}
    for what, call in (("incremental_dump", lambda: incremental_dump(fresh, 0)),):
        with pytest.raises(NotImplementedError) as e:
            call()
        refused[what] = str(e.value)
    c.assert_same_tables(c.contents(fresh), before, what="after refused calls")
    out["refused"] = refused
    return out


@pytest.mark.parametrize("caching", [True, False])
def test_external_tables_train_round_trip_and_publish_metrics(tmp_path, caching):
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    (out,) = h.run_world(_external_world, 1, str(tmp_path), caching)
    assert out["scores"] == {c.COLLECTION: {"t0": None, "t1": None}}
    for what, message in out["refused"].items():
        assert message.startswith(f"{what} is not supported"), message
        assert "external storage PyDictStorage" in message, message
    m = out["metrics"]
    for name, held in out["held"].items():
        # Rows held over the cache and the storage; the storage's capacity; the module's lookups.
        assert m["dynamicemb.table.usage"][name] == held, (name, m["dynamicemb.table.usage"])
        assert m["dynamicemb.table.limit"][name] == out["capacity"][name]
        assert m["dynamicemb.table.lookups"][name] > 0
        # No dynamicemb hash table counts the storage's inserts and evictions.
        for figure in ("inserts", "evictions", "insert_failures", "load_factor"):
            assert name not in m.get(f"dynamicemb.table.{figure}", {}), (figure, m)
        if caching:
            assert m["dynamicemb.cache.hits"][name] + m["dynamicemb.cache.misses"][name] > 0
