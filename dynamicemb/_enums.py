"""The spec's table enums, and the one table constant configuration needs.

``BUCKET_ALIGNMENT`` copies ``kBucketAlignment`` of ``cc/table/types.h`` so
that configuration imports without the extension;
``tests/config/test_native_parity.py`` proves it equal to the extension's. The
enums here are Python's own: the kernels never see their values (the table
maps score strategies to its score policies, ``ScoredHashTable``).

Python-only configuration enums live in ``dynamicemb.dynamicemb_config`` and
``dynamicemb.types``; users import all of them from ``dynamicemb`` or
``dynamicemb.dynamicemb_config``.
"""

import enum

__all__ = [
    "BUCKET_ALIGNMENT",
    "DynamicEmbEvictStrategy",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
]

# Slots per digest probe group; every bucket width and table capacity is a
# multiple of it (kBucketAlignment, cc/table/types.h).
BUCKET_ALIGNMENT = 16


@enum.unique
class DynamicEmbScoreStrategy(enum.IntEnum):
    """How a table sets the scores of the keys of a batch.

    The key with the smallest score in a full bucket is evicted first. For a
    table, the scores of later forward passes are larger than those of earlier
    ones under TIMESTAMP and STEP. ``DynamicEmbTableOptions.score_strategy``
    takes one member, or the compound ``(TIMESTAMP, LFU)`` (either order),
    which keeps two scores per key.

    Attributes:
        TIMESTAMP (int): the device's global nanosecond timer at the forward
            pass. Users must not set scores.
        STEP (int): a per-table step incremented every forward pass; all keys
            of one pass get the same score. Users must not set scores.
        CUSTOMIZED (int): scores are set by the user (``set_score``) before
            each forward pass.
        LFU (int): access frequency; the least used key of a full bucket is
            evicted.
        NO_EVICTION (int): nothing is evicted; the table's capacity doubles
            whenever a new key finds no free slot, until memory runs out.
    """

    TIMESTAMP = 0
    STEP = 1
    CUSTOMIZED = 2
    LFU = 3
    NO_EVICTION = 4


@enum.unique
class DynamicEmbPoolingMode(enum.IntEnum):
    """How the embeddings of a bag are combined.

    An ``IntEnum`` because a pooling mode is handed straight to the kernels
    and compared as an integer, so it stays usable wherever a plain ``int``
    was (``SUM == 0``, dict keys, JSON).

    Attributes:
        SUM (int): sum of the bag's embeddings (optionally weighted);
            output ``(batch_size, total_D)``.
        MEAN (int): mean of the bag's embeddings; output as for SUM.
        NONE (int): no pooling (sequence mode): one row per index; output
            ``(total_indices, D)``.
    """

    SUM = 0
    MEAN = 1
    NONE = 2


@enum.unique
class DynamicEmbEvictStrategy(enum.IntEnum):
    """Eviction policy of a hash table, as the table core names it.

    ``DynamicEmbTableOptions.evict_strategy`` defaults to LRU. The policy a
    table actually runs follows from its ``score_strategy``; this enum names
    the policies of the table core.

    Attributes:
        LRU (int): evict the least recently used key (timestamp score).
        LFU (int): evict the least frequently used key (frequency score).
        EPOCH_LRU (int): LRU whose timestamp is coarsened to an epoch (step).
        EPOCH_LFU (int): LFU whose counts restart every epoch.
        CUSTOMIZED (int): evict by a score the user provides.
    """

    LRU = 0
    LFU = 1
    EPOCH_LRU = 2
    EPOCH_LFU = 3
    CUSTOMIZED = 4
