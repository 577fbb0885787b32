"""Sharding planner support for dynamic embedding tables.

Importing this package needs TorchRec (``import dynamicemb`` does not).
"""

from .constraints import DynamicEmbParameterConstraints
from .enumerator import DynamicEmbeddingEnumerator
from .planner import DynamicEmbeddingShardingPlanner
from .prepare import prepare_table_options
from .topology import topology

__all__ = [
    "DynamicEmbParameterConstraints",
    "DynamicEmbeddingEnumerator",
    "DynamicEmbeddingShardingPlanner",
    "prepare_table_options",
    "topology",
]
