"""Replication of dynamic tables: incremental dumps, their replay into
serving replicas, and the streams of removed keys.

The API's names (also at ``dynamicemb.incremental_dump`` and, for
``replay_increment`` / ``pop_evicted_keys`` / ``pop_erased_keys``, at
``dynamicemb``):

* ``get_score`` / ``set_score``: a table's score of the next forward pass
  (the threshold of a later dump); CUSTOMIZED tables' scores.
* ``incremental_dump`` -> ``{collection: DeltaDumpResult}``: the rows changed
  since a threshold, with their slots, score words (timestamps as ages),
  optimizer state and the keys removed meanwhile.
* ``replay_increment``: writes deltas at the source's slots (a replica of the
  same layout); ``replay_by_key`` writes them by key in the replica's own
  layout (any world size or capacity).
* ``pop_evicted_keys`` / ``pop_erased_keys`` and ``erase_keys``.

Every delta is numbered and checksummed per table (``meta["sequence"]``,
``meta["checksum"]``): a replay refuses a corrupted delta (``DeltaError``)
before it changes anything and applies any other well-formed one.
``DeltaPublisher`` and ``DeltaFollower`` (stream.py) put deltas in a folder
as files and follow it, refusing a gap or a duplicate in the stream.

Importing this package needs TorchRec.
"""

from dynamicemb.replication.delta import DeltaDumpResult, DeltaError, delta_checksum
from dynamicemb.replication.dump import (
    erase_keys,
    incremental_dump,
    pop_erased_keys,
    pop_evicted_keys,
)
from dynamicemb.replication.replay import (
    check_follows,
    layout_mismatch,
    replay_by_key,
    replay_increment,
)
from dynamicemb.replication.scores import get_score, set_score
from dynamicemb.replication.stream import DeltaFollower, DeltaPublisher, read_delta, write_delta
from dynamicemb.types import ReplayStats

__all__ = [
    "DeltaDumpResult",
    "DeltaError",
    "DeltaFollower",
    "DeltaPublisher",
    "ReplayStats",
    "check_follows",
    "delta_checksum",
    "erase_keys",
    "get_score",
    "incremental_dump",
    "layout_mismatch",
    "pop_erased_keys",
    "pop_evicted_keys",
    "read_delta",
    "replay_by_key",
    "replay_increment",
    "set_score",
    "write_delta",
]
