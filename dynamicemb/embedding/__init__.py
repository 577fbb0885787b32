"""Embedding compute: initializers, the per-batch segmented unique, fused
optimizer row updates."""

from dynamicemb.embedding.initializer import init_rows
from dynamicemb.embedding.optimizer import RowOptimizer
from dynamicemb.embedding.unique import SegmentedUnique, segmented_unique

__all__ = ["RowOptimizer", "SegmentedUnique", "init_rows", "segmented_unique"]
