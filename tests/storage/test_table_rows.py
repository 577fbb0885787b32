"""The module's rows object (``TableRows``) over every storage mode: the
size of an exported row is the bytes an export holds per key, whatever the
dtype, optimizer and score words; a load's imports leave the training
insert-failure counter alone; what an external storage cannot do is refused
naming the operation, changing nothing."""

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as Score
from dynamicemb.table import enums
from tests.storage.storage_cases import batches, module, train


def _row_bytes(chunk, with_state: bool, with_slots: bool) -> int:
    """Bytes per key of one exported chunk's tensors."""
    per_key = [chunk.keys, chunk.embeddings]
    per_key += [chunk.optimizer_state] if with_state else []
    per_key += [chunk.words if with_slots else chunk.scores]
    per_key += [chunk.slots] if with_slots else []
    return sum(t.element_size() * (t[0].numel() if t.dim() > 1 else 1) for t in per_key)


@pytest.mark.parametrize("mode", ["device", "hybrid", "cache", "external_cache"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_an_exported_row_has_the_bytes_export_row_bytes_says(mode, dtype, optimizer):
    m = module(mode, optimizer=optimizer, dtype=dtype, score_strategy=(Score.TIMESTAMP, Score.LFU))
    train(m, batches(3, 2))
    rows = m.rows
    for t in range(2):
        chunk = next(iter(rows.export_rows(t, 1 << 20)))
        assert chunk.keys.numel() > 0 and chunk.embeddings.dtype == dtype
        with_state = chunk.optimizer_state is not None
        assert with_state == (optimizer == "adam")
        assert rows.export_row_bytes(t) == _row_bytes(chunk, with_state, False)
        assert rows.export_row_bytes(t, optim=False) == _row_bytes(chunk, False, False)
        if mode != "external_cache":
            changed = next(iter(rows.export_changed(t, 1 << 20, 0)))
            got = rows.export_row_bytes(t, slots=True)
            assert got == _row_bytes(changed, with_state, True)


def test_imports_leave_the_insert_failure_counter_as_it_was():
    # One bucket of 128 slots: importing 200 new keys fails for 72 of them.
    m = module("device", dims=(8,), max_capacity=128)
    rows = m.rows
    col = int(enums.CounterCol.INSERT_FAILURES)
    failures = rows.counters()[:, col].clone()
    keys = torch.arange(1000, 1200)
    emb = torch.zeros(200, 8)
    stored = rows.import_rows(0, keys, torch.ones(200, 1, dtype=torch.int64), emb, None)
    assert int(stored.sum()) == 128
    assert torch.equal(rows.counters()[:, col], failures)
    assert rows.sizes() == [128]


def test_an_external_storage_refuses_what_it_cannot_do_naming_it():
    m = module("external", optimizer="adam")
    train(m, batches(2, 2))
    rows = m.rows
    before = [
        sorted(k for c in rows.export_rows(t, 1 << 20) for k in c.keys.tolist()) for t in (0, 1)
    ]
    assert rows.sizes() == [len(b) for b in before] and all(before)
    for what, call in (
        ("get_score", lambda: rows.current_score(0)),
        ("incremental_dump", lambda: rows.export_changed(0, 16, 0)),
        ("erase_keys", lambda: rows.erase_rows(0, torch.tensor([before[0][0]]))),
        (
            "replay_by_key",
            lambda: rows.upsert_rows(0, torch.tensor([5]), None, torch.zeros(1, 8), None),
        ),
        ("metrics", lambda: rows.counters()),
        ("hash_table", lambda: rows.hash_table),
    ):
        with pytest.raises(NotImplementedError, match=f"^{what} is not supported .* PyDictStorage"):
            call()
    after = [
        sorted(k for c in rows.export_rows(t, 1 << 20) for k in c.keys.tolist()) for t in (0, 1)
    ]
    assert after == before
