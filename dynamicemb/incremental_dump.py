"""Incremental dumps of dynamic embedding tables (the API's import path).

``incremental_dump``, ``get_score``, ``set_score``, ``replay_increment``,
``pop_evicted_keys``, ``pop_erased_keys``, ``DeltaDumpResult`` and
``ReplayStats``, defined in ``dynamicemb.replication`` (which needs TorchRec)
and imported from there when first used (so that this module imports
without TorchRec; the Bazel target //dynamicemb declares the dependency).
"""

from dynamicemb._seams import first_use

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
    if name not in _NAMES:
        raise AttributeError(f"module 'dynamicemb.incremental_dump' has no attribute {name!r}")
    from dynamicemb import replication

    return first_use(globals(), name, replication)
