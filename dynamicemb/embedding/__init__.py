"""Embedding compute: initializers and the per-batch segmented unique."""

from dynamicemb.embedding.initializer import init_rows
from dynamicemb.embedding.unique import SegmentedUnique, segmented_unique

__all__ = ["SegmentedUnique", "init_rows", "segmented_unique"]
