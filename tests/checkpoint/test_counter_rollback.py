"""A load that fails while applying restores every admission counter whole,
even when the counter's ``load`` keeps failing.

The rollback of a failed load puts each table's counter entries back; a
counter whose ``load`` fails from some call on (a custom ``Counter`` over a
store that went away, say) gets them back through ``erase`` and ``add``, and
every table's counter is restored, not only those before the first failure.
Checked through ``DynamicEmbLoad`` on one gloo rank (the fused counter's
``load`` failing from its second call on: the first table's counter loaded,
then every load fails, the rollback's included) and on a custom ``Counter``
written here over a dict.
"""

import io
import os

import numpy as np
import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb.types import Counter, MemoryType
from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
CASE = c.Case(
    "rollback",
    "ec",
    [
        T("t0", 40, 4, dist_type="roundrobin", admit_threshold=3),
        T("t1", 40, 4, dist_type="hash_roundrobin", admit_threshold=3),
        T("t2", 40, 4, dist_type="continuous", admit_threshold=3),
    ],
    optimizer="adam",
    score_strategy=S.STEP,
    key_range=(0, 80),
    batch_size=4,
    max_length=5,
)


class _LoadsFailFrom:
    """``cls.load`` raising from its ``n``-th call on (the calls counted)."""

    def __init__(self, cls, n: int) -> None:
        self.cls, self.n, self.calls = cls, n, 0

    def __enter__(self):
        real = self.real = self.cls.load

        def load(counter, *args, **kwargs):
            self.calls += 1
            if self.calls >= self.n:
                raise RuntimeError("injected counter load failure")
            return real(counter, *args, **kwargs)

        self.cls.load = load
        return self

    def __exit__(self, *exc):
        self.cls.load = self.real


def _world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad
    from dynamicemb.admission import MultiTableKVCounter

    model = c.build(CASE, world)
    c.train(model, CASE, rank)
    good = os.path.join(root, "good")
    DynamicEmbDump(good, model, optim=True)
    target = c.build(CASE, world)
    c.train(target, CASE, rank, first=40)
    before_t, before_c = c.contents(target), c.counters(target)
    assert sum(v["keys"].numel() for v in before_c.values()) > 0
    with _LoadsFailFrom(MultiTableKVCounter, 2) as failing:
        with pytest.raises(RuntimeError, match="injected counter load failure"):
            DynamicEmbLoad(good, target, optim=True)
    assert failing.calls > 2  # the rollback tried the load for every table
    c.assert_same_tables(c.contents(target), before_t, what="rows after the failed load")
    c.assert_same_counters(c.counters(target), before_c, what="counters after the failed load")
    # And the counters still count (the restored entries are live).
    DynamicEmbLoad(good, target, optim=True)
    return {"ok": True}


def test_failed_load_restores_counters_whose_load_keeps_failing(tmp_path):
    (out,) = h.run_world(_world, 1, str(tmp_path))
    assert out == {"ok": True}


class DictCounter(Counter):
    """A custom counter over a dict; ``load`` fails once ``fail_loads`` is
    set, ``add`` once ``fail_adds`` is."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], int] = {}
        self.fail_loads = self.fail_adds = False

    def add(self, keys, table_ids, frequencies):
        if self.fail_adds:
            raise RuntimeError("add failed")
        out = []
        for k, t, f in zip(keys.tolist(), table_ids.tolist(), frequencies.tolist()):
            self.counts[(t, k)] = self.counts.get((t, k), 0) + f
            out.append(self.counts[(t, k)])
        return torch.tensor(out, dtype=torch.int64)

    def erase(self, keys, table_ids):
        for k, t in zip(keys.tolist(), table_ids.tolist()):
            self.counts.pop((t, k), None)

    def memory_usage(self, mem_type=MemoryType.DEVICE):
        return 0

    def load(self, key_file, counter_file, table_id):
        if self.fail_loads:
            raise RuntimeError("load failed")
        keys = np.frombuffer(key_file.read(), dtype=np.int64)
        counts = np.frombuffer(counter_file.read(), dtype=np.int64)
        for k, n in zip(keys.tolist(), counts.tolist()):
            self.counts[(table_id, k)] = n

    def dump(self, key_file, counter_file, table_id):
        items = sorted((k, n) for (t, k), n in self.counts.items() if t == table_id)
        key_file.write(np.array([k for k, _ in items], dtype=np.int64).tobytes())
        counter_file.write(np.array([n for _, n in items], dtype=np.int64).tobytes())


def _entries(counter: DictCounter, table: int) -> dict[int, int]:
    return {k: n for (t, k), n in counter.counts.items() if t == table}


def test_restore_of_a_custom_counter_whose_load_fails():
    from dynamicemb.admission.counters import replace_counter_entries, restore_counter_entries

    counter = DictCounter()
    counter.add(torch.tensor([5, 9, 2]), torch.tensor([0, 0, 1]), torch.tensor([3, 1, 4]))
    old = torch.tensor([5, 9]), torch.tensor([3, 1])
    # A load that replaced table 0's entries, then failed on the next table.
    replace_counter_entries(counter, 0, torch.tensor([7]), torch.tensor([2]))
    counter.fail_loads = True
    restore_counter_entries(counter, 0, *old)
    assert _entries(counter, 0) == {5: 3, 9: 1}
    assert _entries(counter, 1) == {2: 4}  # the other table untouched
    # When add fails too, the load's error is raised.
    counter.fail_adds = True
    with pytest.raises(RuntimeError, match="load failed"):
        restore_counter_entries(counter, 0, torch.tensor([1]), torch.tensor([1]))


def test_dict_counter_round_trip():
    # The custom counter itself: dump and load agree.
    counter = DictCounter()
    counter.add(torch.tensor([4, 8]), torch.tensor([1, 1]), torch.tensor([2, 6]))
    kf, cf = io.BytesIO(), io.BytesIO()
    counter.dump(kf, cf, 1)
    other = DictCounter()
    other.load(io.BytesIO(kf.getvalue()), io.BytesIO(cf.getvalue()), 1)
    assert other.counts == counter.counts
