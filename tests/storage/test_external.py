"""External storage: the module builds the Storage subclass it is given and
refuses one that breaks the contract, naming the class and the method."""

import pytest
import torch

from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2
from dynamicemb.types import MemoryType, Storage, StorageTable
from tests.storage.py_dict_storage import PyDictStorage
from tests.storage.storage_cases import batches, module, table_options, train

from fbgemm_gpu.split_embedding_configs import EmbOptimType  # isort: skip


def _build(cls, caching=True):
    options = table_options("external_cache" if caching else "external", (8, 12), EmbOptimType.ADAM)
    for o in options:
        o.external_storage = cls
    return BatchedDynamicEmbeddingTablesV2(options, optimizer=EmbOptimType.ADAM)


def test_the_module_constructs_the_storage_with_the_tables_row_format():
    m = module("external_cache", optimizer="adam", dims=(8, 12))
    storage = m.storage.backing.storage
    assert isinstance(storage, PyDictStorage)
    assert storage.tables == [
        StorageTable(8, 24, torch.float32, 4096, 1),
        StorageTable(12, 36, torch.float32, 4096, 1),
    ]
    train(m, batches(6, 2))
    # Keys left the cache into the storage, and it reports their memory.
    assert storage.size(0) > 0 and m.memory_usage(MemoryType.HOST) > 0


def test_without_cache_every_row_lives_in_the_storage():
    m = module("external", optimizer="sgd", dims=(8, 12))
    data = batches(3, 2)
    train(m, data)
    storage = m.storage.backing.storage
    assert sum(storage.size(t) for t in range(2)) == sum(m.storage.sizes())
    assert m.storage.cache is None and m.memory_usage(MemoryType.DEVICE) == 0


# PyDictStorage without ``size``: a subclass of Storage that does not
# implement one of its abstract methods.
_Missing = type(
    "_Missing",
    (Storage,),
    {
        k: v
        for k, v in vars(PyDictStorage).items()
        if k not in ("size", "__abstractmethods__", "__dict__", "__weakref__")
        and not k.startswith("_abc")
    },
)


def test_a_missing_method_is_refused_naming_it():
    with pytest.raises(
        TypeError, match=r"external_storage _Missing does not implement Storage\.size"
    ):
        _build(_Missing)


class _WrongDim(PyDictStorage):
    def value_dim(self, table_id):
        return 7


class _WrongFind(PyDictStorage):
    def find(self, keys, table_ids, values):
        return super().find(keys, table_ids, values).long()


class _WrongExport(PyDictStorage):
    def export_batches(self, table_id, batch_size):
        for keys, values, scores in super().export_batches(table_id, batch_size):
            yield keys, values[:, :3], scores


class _WrongSize(PyDictStorage):
    def size(self, table_id):
        return "many"


class _BadConstructor(PyDictStorage):
    def __init__(self, tables):
        super().__init__(tables, "cpu")


class _OptionsConstructor(PyDictStorage):
    """A constructor of another signature: the table's options and optimizer."""

    def __init__(self, options, optimizer):
        super().__init__([], "cpu")
        self.capacity_ = options.max_capacity


def test_the_option_takes_the_class_and_refuses_an_instance_naming_it():
    from dynamicemb import DynamicEmbTableOptions

    assert DynamicEmbTableOptions(external_storage=PyDictStorage).external_storage is PyDictStorage
    instance = PyDictStorage([StorageTable(8, 8, torch.float32, 64, 1)], torch.device("cpu"))
    with pytest.raises(
        TypeError, match=r"got an instance of PyDictStorage; pass the class PyDictStorage itself"
    ):
        DynamicEmbTableOptions(external_storage=instance)
    with pytest.raises(TypeError, match=r"must be a subclass of dynamicemb.types.Storage"):
        DynamicEmbTableOptions(external_storage=dict)


def test_a_constructor_of_another_signature_is_refused_naming_the_class():
    with pytest.raises(
        TypeError,
        match=r"_OptionsConstructor cannot be constructed as _OptionsConstructor\(tables, device\)"
        r".*AttributeError: 'list' object has no attribute 'max_capacity'",
    ):
        _build(_OptionsConstructor)


def test_a_wrong_row_format_is_refused_naming_the_method():
    with pytest.raises(
        ValueError, match=r"_WrongDim\.value_dim\(0\) returned 7; the table's is 24"
    ):
        _build(_WrongDim)


def test_a_wrong_result_type_is_refused_naming_the_method():
    with pytest.raises(TypeError, match=r"_WrongSize\.size must return an int >= 0, got 'many'"):
        _build(_WrongSize)
    with pytest.raises(TypeError, match=r"_BadConstructor cannot be constructed as"):
        _build(_BadConstructor)
    m = _build(_WrongFind)
    idx, off = batches(1, 2)[0]
    with pytest.raises(TypeError, match=r"_WrongFind\.find must return a bool tensor of shape"):
        m(idx, off)


def test_a_wrong_export_is_refused_naming_the_method():
    m = _build(_WrongExport)
    train(m, batches(4, 2))
    m.purge()
    with pytest.raises(TypeError, match=r"_WrongExport\.export_batches must yield"):
        list(m.rows.export_rows(0, 100))
