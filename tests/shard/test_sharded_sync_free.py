"""A training step of a sharded collection with dynamic tables reads nothing
from the device in dynamicemb's code (routing, the lookup, the unbucketize of
sequence outputs, the fused update), at one and two ranks, EmbeddingCollection
and EmbeddingBagCollection: on the CPU through the proxy of
tests/embedding/sync_guard.py, on GPUs under
``torch.cuda.set_sync_debug_mode("error")`` around that code, with no more
synchronizations per step than the same collection with TorchRec's tables
(on a GPU, one more: the batch check's, ``BATCH_CHECK_READS``).

The one read is the batch check's (dynamicemb/shard/batch_checks.py): the
ranks' verdict on their batches with the lengths per feature, which TorchRec
reads in the input distribution anyway; on the CPU, the reads of a whole step
(dynamicemb's and TorchRec's code) are no more than with TorchRec's tables.
Index dedup before the all-to-all reads one number more, the count of distinct
keys that sizes what the all-to-all sends (TorchRec's own dedup does the
same); with one rank it is not done (the module's own dedup is the one).
"""

import contextlib
import os
import warnings

import pytest
import torch

from tests.embedding.sync_guard import (
    PACKAGE_DIR,
    STEP_READS,
    SYNC_WARNING,
    forbid_host_syncs,
)
from tests.shard import shard_harness as h


def _scenario(kind: str, dedup: bool, dynamic: bool = True, optimizer: str = "adam") -> h.Scenario:
    tables = [
        h.TableSpec("a", 1000, 16, dynamic=dynamic, dist_type="hash_roundrobin"),
        h.TableSpec("b", 1000, 16, dynamic=dynamic),
    ]
    return h.Scenario(
        name=f"{kind}-{'dedup' if dedup else 'plain'}",
        kind=kind,
        tables=tables,
        optimizer=optimizer,
        steps=4,
        batch_size=16,
        key_range=(0, 300),
        use_index_dedup=dedup,
        eval_step=False,
    )


def _owner(where: str) -> str:
    """Whose code made a recorded call: "dynamicemb", "torchrec", "by-design"
    (a read of STEP_READS) or "other"; ``where`` ends with the caller's
    frame."""
    import torchrec

    frame = [line for line in where.splitlines() if line.strip().startswith('File "')][-1]
    path = os.path.abspath(frame.split('"')[1])
    function = frame.rsplit(" in ", 1)[1].strip()
    if path.startswith(PACKAGE_DIR):
        inside = f"{os.path.relpath(path, PACKAGE_DIR)}:{function}"
        return "by-design" if inside in STEP_READS else "dynamicemb"
    if path.startswith(os.path.dirname(os.path.abspath(torchrec.__file__))):
        return "torchrec"
    return "other"


def recorded_steps(rank: int, world_size: int, scenario: h.Scenario) -> list[list[tuple]]:
    """The synchronizing calls each step made, each as (``_owner``, its name
    and the innermost frames of its stack)."""
    calls: list[list[tuple[str, str]]] = []

    @contextlib.contextmanager
    def guarded(step):
        calls.append([])
        with forbid_host_syncs(scope=os.sep, record=calls[-1]):
            yield

    h.run_scenario(rank, world_size, scenario, step_context=guarded)
    return [[(_owner(where), f"{name} in\n{where}") for name, where in c] for c in calls]


def _ours(calls) -> list[str]:
    return [call for owner, call in calls if owner == "dynamicemb"]


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("kind,dedup", [("ec", False), ("ec", True), ("ebc", False)])
def test_sharded_step_reads_nothing_from_the_device(world_size, kind, dedup):
    results = h.run_world(recorded_steps, world_size, _scenario(kind, dedup))
    for rank, steps in enumerate(results):
        # From the second step: TorchRec builds the input dists in the first.
        for step, calls in enumerate(steps[1:], 1):
            ours = _ours(calls)
            assert len(ours) >= 1 and "batch_checks.py" in ours[0], (rank, step, ours)
            if dedup and world_size > 1:
                # The dedup's count of distinct keys, and nothing else.
                assert len(ours) == 2 and "dedup_kjt" in ours[1], (rank, step, ours)
            else:
                assert len(ours) == 1, (rank, step, ours)


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("kind", ["ec", "ebc"])
def test_sharded_step_reads_no_more_than_torchrec_tables(world_size, kind):
    counts = {}
    for dynamic in (True, False):
        scenario = _scenario(kind, False, dynamic, optimizer="sgd")
        results = h.run_world(recorded_steps, world_size, scenario)
        counts[dynamic] = [
            [sum(owner in ("dynamicemb", "torchrec") for owner, _ in calls) for calls in steps[1:]]
            for steps in results
        ]
    for rank in range(world_size):
        for ours, theirs in zip(counts[True][rank], counts[False][rank]):
            assert ours <= theirs, (rank, counts)


# ------------------------------------------------------------------ GPUs --


def _raising(fn):
    def run(*args, **kwargs):
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(previous)

    return run


@contextlib.contextmanager
def dynamicemb_code_raises_on_sync():
    """dynamicemb's parts of a sharded step (routing, the lookup, the
    unbucketize, the fused update) run with set_sync_debug_mode("error");
    TorchRec's parts (the all-to-alls with their split exchanges) as they are."""
    from dynamicemb.embedding.batched_tables import _Pool
    from dynamicemb.shard import input_dist, lookup, sharding

    targets = [
        (input_dist, "bucketize_by_route"),
        (lookup.DynamicEmbeddingKernel, "forward"),
        (_Pool, "backward"),
        (sharding._Unbucketize, "forward"),
        (sharding._Unbucketize, "backward"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in targets]
    try:
        for owner, name, original in saved:
            if isinstance(original, staticmethod):
                setattr(owner, name, staticmethod(_raising(original.__func__)))
            else:
                setattr(owner, name, _raising(original))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def sync_counts(rank: int, world_size: int, kind: str) -> dict[str, list[int]]:
    """Synchronizations per step of the dynamic collection (its own code
    raising on any) and of the same collection with TorchRec's tables."""
    out = {}
    for dynamic in (True, False):
        counts: list[int] = []

        @contextlib.contextmanager
        def counted(step):
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    with dynamicemb_code_raises_on_sync() if dynamic else contextlib.nullcontext():
                        yield
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            counts.append(sum(SYNC_WARNING in str(w.message) for w in caught))

        h.run_scenario(rank, world_size, _scenario(kind, False, dynamic), step_context=counted)
        out["dynamic" if dynamic else "torchrec"] = counts
    return out


# On a GPU the batch check's verdict (dynamicemb/shard/batch_checks.py) is
# one read more than TorchRec's step makes: TorchRec's input distribution does
# not read the lengths per feature there, which the check reads with it.
BATCH_CHECK_READS = 1


def _check_counts(results):
    for rank, r in enumerate(results):
        print(f"rank {rank}: synchronizations per step {r}")
        # After the first step (warm-up: lazy initializations).
        for ours, theirs in zip(r["dynamic"][1:], r["torchrec"][1:]):
            assert ours <= theirs + BATCH_CHECK_READS, (rank, r)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ec", "ebc"])
def test_nccl_sharded_step_never_synchronizes_in_dynamicemb_code(kind):
    _check_counts(h.run_world(sync_counts, 1, kind, device_type="cuda"))


@pytest.mark.multigpu
def test_nccl_sharded_step_never_synchronizes_on_every_gpu():
    _check_counts(h.run_world(sync_counts, torch.cuda.device_count(), "ec", device_type="cuda"))
