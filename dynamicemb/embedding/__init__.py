"""Embedding compute: initializers, the per-batch segmented unique, fused
optimizer row updates.

The names are imported on first use, so that the initializers
(``initializer.py``) serve a reader of rows without the training module.
"""

from dynamicemb._seams import first_use

_MODULES = {
    "BatchedDynamicEmbeddingTablesV2": "batched_tables",
    "RowOptimizer": "optimizer",
    "SegmentedUnique": "unique",
    "init_rows": "initializer",
    "segmented_unique": "unique",
}


def __getattr__(name: str):
    module = _MODULES.get(name)
    if module == "batched_tables":
        from dynamicemb.embedding import batched_tables as package
    elif module == "optimizer":
        from dynamicemb.embedding import optimizer as package
    elif module == "unique":
        from dynamicemb.embedding import unique as package
    elif module == "initializer":
        from dynamicemb.embedding import initializer as package
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return first_use(globals(), name, package)


__all__ = [
    "BatchedDynamicEmbeddingTablesV2",
    "RowOptimizer",
    "SegmentedUnique",
    "init_rows",
    "segmented_unique",
]
