"""An external storage that raises in the middle of a training step loses
nothing: for a failure at every call the step makes to the storage (``find``
and ``insert``, in the forward and in the backward), the cache and the
storage hold afterwards exactly the rows they held before the step (keys,
embeddings, optimizer state, scores), the module's step did not advance, and
retrying the batch gives what a run that never failed gives. The same holds
for an ``insert`` that writes part of its rows before it raises, and for a
storage that stays down through the put-back (it is put back once it
answers again)."""

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from tests.storage.py_dict_storage import PyDictStorage
from tests.storage.storage_cases import OPTIMIZERS, batches, table_options

WARMUP = 3  # steps before the one that fails
DIMS = (8, 12)


class StorageDown(RuntimeError):
    """What the storage raises."""


class FlakyStorage(PyDictStorage):
    """PyDictStorage whose ``fail_at``-th call of ``find`` or ``insert``
    (counted together from its construction) raises, having changed nothing
    (with ``partial``, a failing ``insert`` writes the first half of its rows
    first); with ``stay_down``, every call after it raises too (``erase``
    included) until ``down`` is cleared. Rows handed to it without scores get
    score 0, so that runs that write a row a different number of times hold
    the same scores."""

    def __init__(self, tables, device) -> None:
        super().__init__(tables, device)
        self.calls = 0
        self.log: list[str] = []  # the method of every counted call
        self.fail_at: int | None = None
        self.partial = self.stay_down = self.down = False

    def _fails(self, method: str) -> bool:
        """Whether this call of find or insert fails."""
        self.calls += 1
        self.log.append(method)
        if self.calls == self.fail_at:
            self.down = self.stay_down
            return True
        return self.down

    def _raise(self, method: str) -> None:
        raise StorageDown(f"{method} call {self.calls}: the storage is down")

    def find(self, keys, table_ids, values):
        if self._fails("find"):
            self._raise("find")
        return super().find(keys, table_ids, values)

    def insert(self, keys, table_ids, values, scores=None):
        if scores is None:
            scores = torch.zeros(keys.numel(), self.tables[0].num_scores, dtype=torch.int64)
        if self._fails("insert"):
            if self.partial:
                half = keys.numel() // 2
                super().insert(keys[:half], table_ids[:half], values[:half], scores[:half])
            self._raise("insert")
        super().insert(keys, table_ids, values, scores)

    def erase(self, keys, table_ids):
        if self.down:
            self._raise("erase")
        super().erase(keys, table_ids)


def _module(caching: bool, strategy):
    """Tables of DIMS over a FlakyStorage, behind a 16-row device cache
    (most of a batch's keys do not fit: they are staged) or without one."""
    opt, args = OPTIMIZERS["adam"]
    options = table_options(
        "external_cache" if caching else "external",
        DIMS,
        opt,
        max_capacity=1024,
        score_strategy=strategy,
    )
    for o in options:
        o.external_storage = FlakyStorage
        if caching:
            o.local_hbm_for_values = 16 * value_row_bytes(opt, o.dim, torch.float32)
    m = BatchedDynamicEmbeddingTablesV2(options, optimizer=opt, device=torch.device("cpu"), **args)
    return m, m.storage.backing.storage


def _state(m) -> dict:
    """Every stored key of every table over the cache and the storage, with
    its row and scores, and the module's step."""
    out = {"step": m.step}
    for t in range(len(DIMS)):
        chunks = list(m.rows.export_rows(t, 1 << 16))
        keys = torch.cat([c.keys for c in chunks])
        order = torch.argsort(keys)
        out[t] = {
            "keys": keys[order],
            "emb": torch.cat([c.embeddings.float() for c in chunks])[order],
            "opt": torch.cat([c.optimizer_state for c in chunks])[order],
            "scores": torch.cat([c.scores for c in chunks])[order],
        }
    out["sizes"] = m.rows.sizes()
    return out


def _assert_same(got, want, what):
    assert got["step"] == want["step"], (what, got["step"], want["step"])
    assert got["sizes"] == want["sizes"], (what, got["sizes"], want["sizes"])
    for t in range(len(DIMS)):
        for f in ("keys", "emb", "opt", "scores"):
            assert torch.equal(got[t][f], want[t][f]), f"{what}: table {t} {f} differ"


def _step(m, batch, i):
    """One training step; returns its output."""
    indices, offsets = batch
    out = m(indices, offsets)
    g = torch.Generator().manual_seed(100 + i)
    out.backward(torch.randn(out.shape, generator=g))
    return out.detach()


def _trained(caching, strategy, data):
    m, storage = _module(caching, strategy)
    for i in range(WARMUP):
        _step(m, data[i], i)
    return m, storage


STRATEGIES = [DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.STEP]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("caching", [True, False], ids=["cache16", "no_cache"])
def test_a_storage_failing_at_any_call_of_a_step_changes_nothing(caching, strategy):
    data = batches(WARMUP + 2, len(DIMS), batch=24)
    # The run that never fails, and the storage calls of the step that will.
    reference, ref_storage = _trained(caching, strategy, data)
    first = ref_storage.calls
    want_out = _step(reference, data[WARMUP], WARMUP)
    calls = ref_storage.calls - first
    assert calls >= (4 if caching else 3), calls  # reads and writes of both tables
    want_next = _step(reference, data[WARMUP + 1], WARMUP + 1)
    want = _state(reference)
    for k in range(1, calls + 1):
        m, storage = _trained(caching, strategy, data)
        before = _state(m)
        storage.fail_at = storage.calls + k
        with pytest.raises(StorageDown):
            _step(m, data[WARMUP], WARMUP)
        _assert_same(_state(m), before, f"call {k} of {calls} failed")
        # The batch again, and one more, as if nothing had failed.
        got_out = _step(m, data[WARMUP], WARMUP)
        assert torch.equal(got_out, want_out), f"call {k}: retried step's output"
        got_next = _step(m, data[WARMUP + 1], WARMUP + 1)
        assert torch.equal(got_next, want_next), f"call {k}: next step's output"
        _assert_same(_state(m), want, f"call {k}: after the retry")


@pytest.mark.parametrize("mode", ["partial", "stay_down"])
@pytest.mark.parametrize("caching", [True, False], ids=["cache16", "no_cache"])
def test_an_insert_that_writes_part_of_its_rows_or_a_storage_that_stays_down(caching, mode):
    # The step's inserts fail: one that writes half of its rows first, or
    # one after which the storage stays down (its put-back fails too, and is
    # made when the storage answers again).
    strategy = DynamicEmbScoreStrategy.LFU
    data = batches(WARMUP + 2, len(DIMS), batch=24)
    reference, ref_storage = _trained(caching, strategy, data)
    first = ref_storage.calls
    want_out = _step(reference, data[WARMUP], WARMUP)
    inserts = [k for k, m in enumerate(ref_storage.log[first:], 1) if m == "insert"]
    assert inserts
    want_next = _step(reference, data[WARMUP + 1], WARMUP + 1)
    want = _state(reference)
    for k in inserts:
        m, storage = _trained(caching, strategy, data)
        before = _state(m)
        storage.fail_at = storage.calls + k
        setattr(storage, mode, True)
        with pytest.raises(StorageDown):
            _step(m, data[WARMUP], WARMUP)
        if mode == "stay_down":
            with pytest.raises(StorageDown):  # the put-back is owed: nothing else first
                _state(m)
            storage.down = False
        _assert_same(_state(m), before, f"{mode} insert {k}")
        assert torch.equal(_step(m, data[WARMUP], WARMUP), want_out), f"{mode} insert {k}"
        assert torch.equal(_step(m, data[WARMUP + 1], WARMUP + 1), want_next), f"{mode} {k}"
        _assert_same(_state(m), want, f"{mode} insert {k}: after the retry")


@pytest.mark.parametrize("caching", [True, False], ids=["cache16", "no_cache"])
def test_flush_that_fails_keeps_the_cached_rows(caching):
    data = batches(WARMUP, len(DIMS), batch=24)
    m, storage = _trained(caching, DynamicEmbScoreStrategy.LFU, data)
    before = _state(m)
    storage.fail_at = storage.calls + 2  # the second table's write-back
    if caching:
        with pytest.raises(StorageDown):
            m.flush()
    else:
        m.flush()  # nothing cached, nothing written
    _assert_same(_state(m), before, "failed flush")
    m.flush()
    _assert_same(_state(m), before, "flush")


def test_a_prefetch_that_fails_changes_nothing():
    data = batches(WARMUP + 2, len(DIMS), batch=24)
    strategy = DynamicEmbScoreStrategy.LFU
    reference, ref_storage = _trained(True, strategy, data)
    first = ref_storage.calls
    reference.prefetch(*data[WARMUP])
    calls = ref_storage.calls - first
    assert calls >= 3, calls  # reads of both tables, write-back of the keys it evicts
    want_out = _step(reference, data[WARMUP], WARMUP)
    want = _state(reference)
    for k in range(1, calls + 1):
        m, storage = _trained(True, strategy, data)
        before = _state(m)
        storage.fail_at = storage.calls + k
        with pytest.raises(StorageDown):
            m.prefetch(*data[WARMUP])
        _assert_same(_state(m), before, f"prefetch call {k} of {calls} failed")
        m.prefetch(*data[WARMUP])
        assert torch.equal(_step(m, data[WARMUP], WARMUP), want_out), f"prefetch call {k}"
        _assert_same(_state(m), want, f"prefetch call {k}: after the retry")
