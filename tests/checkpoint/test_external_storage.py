"""Tables whose rows live in an external ``Storage``: a checkpoint dumps and
loads them through the storage's own interface (every key, its embedding,
optimizer state and scores), while what needs a dynamicemb hash table
(incremental dumps and scores, metrics) is refused with an error naming the
operation, and changes nothing."""

import os

import pytest

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec


def _case(caching: bool) -> c.Case:
    from tests.storage.py_dict_storage import PyDictStorage

    return c.Case(
        f"external_{'cache' if caching else 'only'}",
        "ec",
        [T("t0", 64, 4, dist_type="roundrobin"), T("t1", 48, 4, dist_type="hash_roundrobin")],
        optimizer="adam",
        steps=4,
        key_range=(-20, 200),
        batch_size=6,
        options=dict(external_storage=PyDictStorage, caching=caching, local_hbm_for_values=64 * 48),
    )


def _external_world(rank, world, root, caching):
    from dynamicemb.checkpoint import dump, load
    from dynamicemb.metrics import instrument
    from dynamicemb.replication import get_score, incremental_dump

    case = _case(caching)
    model = c.build(case, world)
    c.train(model, case, rank)
    want = c.contents(model)
    assert all(want[n]["keys"].numel() for n in want)
    path = os.path.join(root, case.name)
    dump(path, model, optim=True, show_progress=False)
    fresh = c.build(case, world)
    c.train(fresh, case, rank, steps=1, first=50)  # keys the load must remove
    report = load(path, fresh, optim=True, show_progress=False)
    assert all(t.dropped == 0 for t in report.tables)
    c.assert_same_tables(c.contents(fresh), want)
    refused = {}
    for what, call in (
        ("get_score", lambda: get_score(fresh)),
        ("incremental_dump", lambda: incremental_dump(fresh, 0)),
        ("metrics", lambda: instrument(fresh)),
    ):
        with pytest.raises(NotImplementedError) as e:
            call()
        refused[what] = str(e.value)
    c.assert_same_tables(c.contents(fresh), want)
    return refused


@pytest.mark.parametrize("caching", [True, False])
def test_external_tables_round_trip_and_refuse_what_they_cannot_do(tmp_path, caching):
    (refused,) = h.run_world(_external_world, 1, str(tmp_path), caching)
    for what, message in refused.items():
        assert message.startswith(f"{what} is not supported"), message
        assert "external storage PyDictStorage" in message, message
