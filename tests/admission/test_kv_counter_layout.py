"""A ``KVCounter`` follows the table's bucket rules: its capacity in whole
buckets of ``bucket_capacity``, and a capacity smaller than a bucket (the
default bucket is 1024 slots) is one bucket of that capacity, rounded up to
a multiple of 16."""

import pytest
import torch

from dynamicemb import DynamicEmbTableOptions, FrequencyAdmissionStrategy, KVCounter, MemoryType
from dynamicemb.admission import MultiTableKVCounter


@pytest.mark.parametrize(
    "counter, slots, width",
    [
        (KVCounter(100), 112, 112),  # below the default bucket of 1024: one bucket
        (KVCounter(16), 16, 16),
        (KVCounter(1000, bucket_capacity=1024), 1008, 1008),
        (KVCounter(1024), 1024, 1024),
        (KVCounter(1025), 2048, 1024),  # whole buckets
        (KVCounter(1000, bucket_capacity=128), 1024, 128),
    ],
)
def test_capacity_below_a_bucket_is_one_bucket_of_that_capacity(counter, slots, width):
    c = MultiTableKVCounter([counter, KVCounter(64, bucket_capacity=16)])
    assert (c.table.capacity(0), c.table.bucket_capacity(0)) == (slots, width)
    assert (c.table.capacity(1), c.table.bucket_capacity(1)) == (64, 16)
    # The strategy's memory is that of the share it builds.
    alone = MultiTableKVCounter([counter])
    assert FrequencyAdmissionStrategy(2, counter).state_bytes() == alone.memory_usage(
        MemoryType.HOST
    )


def test_one_bucket_holds_its_capacity_and_then_evicts_the_smallest_count():
    c = MultiTableKVCounter([KVCounter(100)])
    keys = torch.arange(1, 113)
    tids = torch.zeros_like(keys)
    # Every key is in the one bucket: 112 keys fit, counted once each ...
    assert c.add(keys, tids, torch.ones_like(keys)).tolist() == [1] * 112
    assert c.add(keys[1:], tids[1:], torch.ones_like(keys[1:])).tolist() == [2] * 111
    assert c.table.counter("SIZE").tolist() == [112]
    # ... and the 113th evicts the smallest count, key 1's.
    new = torch.tensor([500])
    assert c.add(new, torch.zeros_like(new), torch.ones_like(new)).tolist() == [1]
    assert c.get(torch.tensor([1, 500]), torch.zeros(2, dtype=torch.int64)).tolist() == [0, 1]
    assert c.table.counter("EVICTIONS").tolist() == [1]


def test_a_module_admits_through_a_counter_smaller_than_a_bucket():
    from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2

    strategy = FrequencyAdmissionStrategy(threshold=2, counter=KVCounter(capacity=100))
    options = DynamicEmbTableOptions(dim=4, max_capacity=128, admit_strategy=strategy)
    module = BatchedDynamicEmbeddingTablesV2([options], feature_table_map=[0])
    keys = torch.tensor([7, 8, 7])
    offsets = torch.tensor([0, 3])
    module(keys, offsets).sum().backward()  # 7 seen twice: admitted; 8 once: waits
    module.eval()
    with torch.no_grad():
        rows = module(torch.tensor([7, 8]), torch.tensor([0, 1, 2]))
    assert rows[0].abs().sum() > 0  # stored
    assert torch.equal(rows[1], torch.zeros(4))  # not stored: the eval initializer
