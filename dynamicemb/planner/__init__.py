"""Sharding planner support for dynamic embedding tables.

Importing this package needs TorchRec (``import dynamicemb`` does not).
"""

from .constraints import DynamicEmbParameterConstraints

__all__ = ["DynamicEmbParameterConstraints"]
