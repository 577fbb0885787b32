"""insert_and_evict with per-slot victim scores (what a score_function
computes): the untouched slot with the lowest victim score goes, NaN first,
ties by the score words, then the position; home_starts and the clock."""

import math

import pytest
import torch

from dynamicemb.table import ScoredHashTable
from tests.devices import DEVICES
from tests.table.table_testlib import (
    assert_same_snapshot,
    i64,
    keys_in_bucket,
    raw_run,
    snapshot,
)

ASSIGN = 1


def _full_bucket(device):
    """One 16-slot bucket holding keys 100..115 at positions 0..15, key
    100 + p with score (p, 0) (num_scores 2)."""
    t = ScoredHashTable([16], bucket_capacities=None, num_scores=2, device=device)
    keys = i64(range(100, 116), device)
    scores = torch.stack([torch.arange(16), torch.zeros(16, dtype=torch.int64)], 1).to(device)
    res = t.insert(keys, policies=[ASSIGN, ASSIGN], scores=scores)
    assert res.slots.cpu().tolist() == list(range(16))
    return t


def _victims(t, new_keys, victim_scores, device):
    res = t.insert_and_evict(
        i64(new_keys, device),
        policies=[ASSIGN, ASSIGN],
        scores=[99, 0],
        victim_scores=torch.tensor(victim_scores, dtype=torch.float64, device=device),
    )
    ev = res.evicted.compact()
    return ev.keys.cpu().tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_the_lowest_victim_score_goes_not_the_lowest_score_word(device):
    t = _full_bucket(device)
    vs = [float(16 - p) for p in range(16)]  # the reverse of the score words
    assert _victims(t, [200], vs, device) == [115]
    assert _victims(_full_bucket(device), [200], [0.0] * 16, device) == [100]  # ties: score words


@pytest.mark.parametrize("device", DEVICES)
def test_nan_goes_first_then_minus_infinity(device):
    vs = [1.0] * 16
    vs[5], vs[9], vs[12] = -math.inf, math.nan, -1e308
    t = _full_bucket(device)
    # Three new keys in one batch take the three lowest, NaN first; the keys
    # the batch placed are never victims.
    assert _victims(t, [200, 201, 202], vs, device) == [109, 105, 112]
    assert t.find(i64([200, 201, 202], device)).cpu().tolist() == [9, 5, 12]


@pytest.mark.parametrize("device", DEVICES)
def test_minus_zero_ties_with_zero(device):
    vs = [1.0] * 16
    vs[7], vs[3] = -0.0, 0.0  # equal: the smaller score word (position 3) goes
    assert _victims(_full_bucket(device), [200], vs, device) == [103]


@pytest.mark.parametrize("device", DEVICES)
def test_without_victim_scores_the_score_words_rank(device):
    t = _full_bucket(device)
    res = t.insert_and_evict(i64([200], device), policies=[ASSIGN, ASSIGN], scores=[99, 0])
    assert res.evicted.compact().keys.cpu().tolist() == [100]


def test_bad_victim_scores_are_refused_and_change_nothing():
    t = _full_bucket("cpu")
    before = snapshot(t)
    with pytest.raises(TypeError, match="float64"):
        t.insert_and_evict(i64([200]), victim_scores=torch.zeros(16, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"one entry per slot \(16\), got shape \(15,\)"):
        t.insert_and_evict(i64([200]), victim_scores=torch.zeros(15, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"victim_scores must be a contiguous \(16\) tensor"):
        raw_run(t, [200], 1, victim_scores=torch.zeros(8, dtype=torch.float64))
    assert_same_snapshot(before, snapshot(t))


@pytest.mark.parametrize("device", DEVICES)
def test_home_starts_are_the_first_slots_of_the_home_buckets(device):
    t = ScoredHashTable([64, 128], bucket_capacities=[16, 32], device=device)
    k0 = keys_in_bucket(64, 16, 2, 3)
    k1 = keys_in_bucket(128, 32, 3, 2)
    keys = i64(k0 + k1, device)
    tids = i64([0] * 3 + [1] * 2, device)
    assert t.home_starts(keys, tids).cpu().tolist() == [32] * 3 + [64 + 96] * 2
    with pytest.raises(ValueError, match="table id 2 at index 0"):
        t.home_starts(i64([1]), i64([2]))


@pytest.mark.parametrize("device", DEVICES)
def test_the_timer_is_the_clock_of_the_timer_policy(device):
    t = ScoredHashTable([16], bucket_capacities=None, device=device)
    before = int(t.timer()[0])
    t.insert(i64([5], device), policies=[3])
    after = int(t.timer()[0])
    assert before <= int(t.scores[0, 0]) <= after
