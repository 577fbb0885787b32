"""``keep_order`` (dynamicemb/table/victims.py), the victim order for keys a
table does not hold yet, against the table's own: a full bucket's keys
evicted one after the other by a batch of new keys come out in the victim
order (cc/table/scores.h), the reverse of the order ``keep_order`` keeps
them in."""

import math

import pytest
import torch

from dynamicemb.table import ScoredHashTable, keep_order
from tests.devices import DEVICES
from tests.table.table_testlib import i64

ASSIGN = 1
WIDTH = 32

# Victim scores with every case the order distinguishes: NaN (below every
# number), the infinities, -0.0 and 0.0 (equal), ties.
VICTIM_VALUES = [math.nan, -math.inf, -1e308, -1.5, -0.0, 0.0, 0.25, 1.5, 1e308, math.inf]


def _eviction_order(words, victim_scores, device):
    """The keys of one full bucket (key 100 + i at position i, score words
    ``words[i]``) in the order a batch of ``WIDTH`` new keys evicts them."""
    t = ScoredHashTable([WIDTH], bucket_capacities=None, num_scores=2, device=device)
    keys = i64(range(100, 100 + WIDTH), device)
    res = t.insert(keys, policies=[ASSIGN, ASSIGN], scores=words.to(device))
    assert res.slots.cpu().tolist() == list(range(WIDTH))  # position i: key 100 + i
    vs = None if victim_scores is None else victim_scores.to(device)
    new = i64(range(1000, 1000 + WIDTH), device)
    ev = t.insert_and_evict(new, policies=[ASSIGN, ASSIGN], scores=[0, 0], victim_scores=vs)
    evicted = ev.evicted.compact().keys.cpu().tolist()
    assert sorted(evicted) == list(range(100, 100 + WIDTH))
    return [k - 100 for k in evicted]


def _distinct_words(g):
    """(WIDTH, 2) score words, word 0 from a few values (ties for word 1 to
    break), no two rows equal (so that no two keys are ordered by their
    positions, which keys not yet in a table do not have)."""
    pairs = torch.randperm(4 * 16, generator=g)[:WIDTH]
    return torch.stack([pairs // 16, (pairs % 16) * 3 - 20], dim=1).to(torch.int64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(5))
def test_keep_order_is_the_reverse_of_the_tables_eviction_order(device, seed):
    g = torch.Generator().manual_seed(seed)
    words = _distinct_words(g)
    kept = keep_order(words).tolist()
    assert _eviction_order(words, None, device) == kept[::-1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(5))
def test_keep_order_with_victim_scores_is_the_reverse_of_the_tables(device, seed):
    g = torch.Generator().manual_seed(100 + seed)
    words = _distinct_words(g)
    pick = torch.randint(len(VICTIM_VALUES), (WIDTH,), generator=g).tolist()
    victim = torch.tensor([VICTIM_VALUES[i] for i in pick], dtype=torch.float64)
    kept = keep_order(words, victim).tolist()
    assert _eviction_order(words, victim, device) == kept[::-1]


def test_keys_tied_in_everything_keep_their_given_order():
    words = torch.tensor([[1, 2], [3, 0], [1, 2], [3, 0]])
    victim = torch.tensor([0.0, 5.0, -0.0, 5.0], dtype=torch.float64)
    assert keep_order(words, victim).tolist() == [1, 3, 0, 2]
    assert keep_order(words).tolist() == [1, 3, 0, 2]
