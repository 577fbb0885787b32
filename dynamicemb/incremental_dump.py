"""Incremental dumps of dynamic embedding tables (the API's import path).

``incremental_dump``, ``get_score``, ``set_score``, ``replay_increment``,
``pop_evicted_keys``, ``pop_erased_keys``, ``DeltaDumpResult`` and
``ReplayStats``, defined in ``dynamicemb.replication`` (which needs TorchRec)
and imported from there when first used.
"""

_NAMES = (
    "DeltaDumpResult",
    "ReplayStats",
    "get_score",
    "incremental_dump",
    "pop_erased_keys",
    "pop_evicted_keys",
    "replay_increment",
    "set_score",
)

__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        import importlib

        value = getattr(importlib.import_module("dynamicemb.replication"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dynamicemb.incremental_dump' has no attribute {name!r}")
