"""erase(record=True) keeps the keys an erase really removed, per table, until
pop_erased_keys reads and clears them."""

import pytest
import torch

from dynamicemb.table import ScoredHashTable
from tests.devices import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_recorded_erases_are_the_removed_keys_per_table_once(device):
    t = ScoredHashTable([64, 64], bucket_capacities=16, device=device)
    keys = torch.arange(1, 21)
    tids = keys % 2
    t.insert(keys.to(device), tids.to(device))
    # 5 and 7 (table 1) and 4 (table 0) are present; 99 is not; 5 repeats.
    removed = t.erase(
        torch.tensor([5, 99, 4, 5, 7]).to(device),
        torch.tensor([1, 1, 0, 1, 1]).to(device),
        record=True,
    )
    assert removed.cpu().tolist() == [True, False, True, False, True]
    t.erase(torch.tensor([6]).to(device), torch.tensor([0]).to(device))  # not recorded
    t.erase(torch.tensor([9]).to(device), torch.tensor([1]).to(device), record=True)
    per_table = t.pop_erased_keys()
    assert [x.cpu().tolist() for x in per_table] == [[4], [5, 7, 9]]
    assert [x.numel() for x in t.pop_erased_keys()] == [0, 0]
    assert (
        t.find(torch.tensor([4, 5, 6, 7, 9]).to(device), torch.tensor([0, 1, 0, 1, 1]).to(device))
        .cpu()
        .tolist()
        == [-1] * 5
    )
