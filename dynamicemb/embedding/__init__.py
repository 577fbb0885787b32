"""Embedding compute: initializers, the per-batch segmented unique, fused
optimizer row updates."""

from dynamicemb.embedding.batched_tables import BatchedDynamicEmbeddingTablesV2
from dynamicemb.embedding.initializer import init_rows
from dynamicemb.embedding.optimizer import RowOptimizer
from dynamicemb.embedding.unique import SegmentedUnique, segmented_unique

__all__ = [
    "BatchedDynamicEmbeddingTablesV2",
    "RowOptimizer",
    "SegmentedUnique",
    "init_rows",
    "segmented_unique",
]
