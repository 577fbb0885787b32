"""dynamicemb: hash-table-backed dynamic embedding tables for TorchRec.

An embedding table whose rows live in a scored, bucketized hash table instead
of a dense tensor: raw 64-bit ids, rows created on first sight, evicted by
score when full, admitted by frequency, spread over device and host memory.

This package imports with torch alone. TorchRec is needed by
``dynamicemb.planner``, ``dynamicemb.shard``, ``dynamicemb.checkpoint``
(whose ``DynamicEmbDump`` / ``DynamicEmbLoad`` are exported here and
imported on first use) and ``dynamicemb.replication`` (``replay_increment``,
``pop_evicted_keys``, ``pop_erased_keys``, likewise); the C++ extension
(``dynamicemb._C``) is loaded by the table layer when a table is built. The
provided admission strategies (``dynamicemb.admission``, which needs the
table layer) are exported here and imported on first use too, as is
``InferenceEmbeddingTable`` (``dynamicemb.inference``, which needs TorchRec).
"""

# The release, the one source of the version: the wheel's metadata reads it
# (pyproject.toml), MODULE.bazel and CHANGELOG.md are checked against it
# (tests/packaging). Versioning policy: docs/building.md, "Versions".
__version__ = "0.1.0"

from ._seams import first_use as _first_use
from ._seams import provide as _provide
from .dynamicemb_config import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbOptimType,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
    ReplayContent,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from .types import (
    AdmissionStrategy,
    Counter,
    KVCounter,
    MemoryType,
    MultiTableAdmitter,
    ReplayStats,
)

# Names exported here but defined in the packages above this one (they need
# TorchRec or the extension): imported when first used, so that
# `import dynamicemb` needs torch alone. The Bazel target of the whole package,
# //dynamicemb, declares these dependencies.
_CHECKPOINT = ("DynamicEmbDump", "DynamicEmbLoad")
_REPLICATION = ("DeltaDumpResult", "pop_erased_keys", "pop_evicted_keys", "replay_increment")
_ADMISSION = ("FrequencyAdmissionStrategy", "ProbabilisticAdmissionStrategy")
_INFERENCE = ("InferenceEmbeddingTable", "InferenceTableConfig")


def _model_state_rows():
    """The dynamic tables' rows in a sharded model's state_dict(): written and
    read by dynamicemb.checkpoint, called by dynamicemb.shard (_seams.py)."""
    from dynamicemb.checkpoint.model_state import MODEL_STATE_ROWS

    return MODEL_STATE_ROWS


_provide("model_state_rows", _model_state_rows)
_provide("version", lambda: __version__)


def __getattr__(name: str):
    if name in _CHECKPOINT:
        from dynamicemb import checkpoint as package
    elif name in _REPLICATION:
        from dynamicemb import replication as package
    elif name in _ADMISSION:
        from dynamicemb import admission as package
    elif name in _INFERENCE:
        from dynamicemb import inference as package
    else:
        raise AttributeError(f"module 'dynamicemb' has no attribute {name!r}")
    return _first_use(globals(), name, package)


__all__ = [
    "AdmissionStrategy",
    "BUCKET_ALIGNMENT",
    "MAX_BUCKET_CAPACITY",
    "Counter",
    "DynamicEmbCheckMode",
    "DynamicEmbDump",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbLoad",
    "DynamicEmbOptimType",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "FrequencyAdmissionStrategy",
    "InferenceEmbeddingTable",
    "InferenceTableConfig",
    "KVCounter",
    "MemoryType",
    "MultiTableAdmitter",
    "ProbabilisticAdmissionStrategy",
    "DeltaDumpResult",
    "ReplayContent",
    "ReplayStats",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
    "pop_erased_keys",
    "pop_evicted_keys",
    "replay_increment",
]
