"""Serving dynamic tables: ``InferenceEmbeddingTable``, a read-only lookup
module built from a ``DynamicEmbDump`` checkpoint and kept current by a
delta stream (``dynamicemb.replication.DeltaFollower``), rows stored in
float32, float16, bfloat16, FP8 or row-wise INT8.

This package reads checkpoints and deltas through the checkpoint and
replication packages' readers and never imports the training code (the
embedding module, the sharders, the storage tiers): a serving process loads
neither.
"""

from dynamicemb.inference.formats import FORMATS, RowFormat, format_of
from dynamicemb.inference.table import InferenceEmbeddingTable, InferenceTableConfig

__all__ = [
    "FORMATS",
    "InferenceEmbeddingTable",
    "InferenceTableConfig",
    "RowFormat",
    "format_of",
]
