"""Tests of the pluggable interfaces in dynamicemb.types."""

import dataclasses
import inspect

import pytest
import torch

from dynamicemb.types import (
    AdmissionStrategy,
    Counter,
    KVCounter,
    MemoryType,
    MultiTableAdmitter,
    Storage,
)


@pytest.mark.parametrize(
    "cls, abstract",
    [
        (Counter, {"add", "erase", "memory_usage", "load", "dump"}),
        (AdmissionStrategy, {"create_admitter"}),
        (MultiTableAdmitter, {"admit"}),
    ],
)
def test_interfaces_declare_exactly_the_spec_abstract_methods(cls, abstract):
    assert cls.__abstractmethods__ == frozenset(abstract)
    with pytest.raises(TypeError):
        cls()


def test_storage_is_abstract():
    assert {"find", "insert", "erase", "size", "capacity"} <= Storage.__abstractmethods__
    with pytest.raises(TypeError):
        Storage()


def test_counter_memory_usage_defaults_to_device():
    default = inspect.signature(Counter.memory_usage).parameters["mem_type"].default
    assert default is MemoryType.DEVICE


class _AdmitAll(MultiTableAdmitter):
    def admit(self, keys, table_ids, frequencies=None):
        return torch.ones_like(keys, dtype=torch.bool)


def test_admitter_that_only_decides_has_no_state_nor_initializer():
    admitter = _AdmitAll()
    keys = torch.tensor([3, 5])
    assert admitter.admit(keys, torch.zeros_like(keys)).tolist() == [True, True]
    assert admitter.state() is None
    assert admitter.non_admitted_initializer is None


class _Strategy(AdmissionStrategy):
    @classmethod
    def create_admitter(cls, table_strategies, device):
        return _AdmitAll()


def test_strategy_grouped_key_defaults_to_the_instance():
    strategy = _Strategy()
    assert strategy.get_grouped_key() is strategy
    assert _Strategy().get_grouped_key() != strategy.get_grouped_key()


def test_one_configuration_is_the_first_strategy():
    first, second = _Strategy(), _Strategy()
    assert _Strategy.one_configuration([first, second]) is first
    with pytest.raises(ValueError, match=r"\[\]"):
        _Strategy.one_configuration([])


def test_kv_counter_defaults_and_value_semantics():
    counter = KVCounter(capacity=1 << 20)
    assert (counter.capacity, counter.bucket_capacity, counter.key_type) == (
        1 << 20,
        1024,
        torch.int64,
    )
    assert KVCounter(4096) == KVCounter(4096)
    assert hash(KVCounter(4096)) == hash(KVCounter(4096))
    assert not isinstance(counter, Counter)
    with pytest.raises(dataclasses.FrozenInstanceError):
        counter.capacity = 1


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": -5}, "-5"),
        ({"capacity": 4096, "bucket_capacity": 0}, "bucket_capacity"),
        ({"capacity": 4096, "key_type": torch.float32}, "float32"),
    ],
)
def test_kv_counter_rejects_bad_sizes_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=named):
        KVCounter(**kwargs)
