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
``DeltaPublisher`` (stream.py) and ``DeltaFollower`` (follow.py) put deltas
in a folder as files and follow it, refusing a gap or a duplicate in the
stream; a follower keeps a model or an ``InferenceEmbeddingTable`` current.

Its names are imported on first use; those of the training side (dumps,
replays into a model, scores) need TorchRec.
"""

from dynamicemb._seams import first_use
from dynamicemb.types import ReplayStats

# Each public name and the module that defines it, imported on first use:
# what a serving process reads (delta.py, stream_files.py, follow.py) does
# not need the training side (dump, replay and scores reach a model's tables
# through the sharders).
_MODULES = {
    "DeltaDumpResult": "delta",
    "DeltaError": "delta",
    "delta_checksum": "delta",
    "erase_keys": "dump",
    "incremental_dump": "dump",
    "pop_erased_keys": "dump",
    "pop_evicted_keys": "dump",
    "check_follows": "replay",
    "layout_mismatch": "replay",
    "replay_by_key": "replay",
    "replay_increment": "replay",
    "get_score": "scores",
    "set_score": "scores",
    "DeltaFollower": "follow",
    "StreamReplica": "follow",
    "DeltaPublisher": "stream",
    "read_delta": "stream_files",
    "write_delta": "stream_files",
}


def __getattr__(name: str):
    module = _MODULES.get(name)
    if module == "delta":
        from dynamicemb.replication import delta as package
    elif module == "dump":
        from dynamicemb.replication import dump as package
    elif module == "replay":
        from dynamicemb.replication import replay as package
    elif module == "scores":
        from dynamicemb.replication import scores as package
    elif module == "follow":
        from dynamicemb.replication import follow as package
    elif module == "stream":
        from dynamicemb.replication import stream as package
    elif module == "stream_files":
        from dynamicemb.replication import stream_files as package
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return first_use(globals(), name, package)


__all__ = [
    "DeltaDumpResult",
    "DeltaError",
    "DeltaFollower",
    "DeltaPublisher",
    "ReplayStats",
    "StreamReplica",
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
