"""A rank's process group is gone when destroy_process_group returns, with
every thread it ran (gloo's workers and transport loop, the store's), so no
such thread is alive when the process exits: one still running, or releasing
a transfer's tensors, when the interpreter is torn down aborts the process
("terminate called without an active exception"). The ranks join their group
through examples/dist_launch.py, as the main job's do, and train a sharded
model first (TorchRec, imported after the group exists)."""

import os

from tests.shard import shard_harness as h

# Threads of a gloo process group and of its store (their names in /proc).
GROUP_THREADS = ("gloo", "pt_gloo", "pt_tcpstore")


def _threads() -> list[str]:
    return sorted(
        open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")
    )


def _train(rank: int, world: int) -> list[str]:
    """A sharded model's step; returns the threads running then."""
    scenario = h.Scenario(
        name="ec",
        kind="ec",
        tables=[h.TableSpec("t0", 40, 4), h.TableSpec("s", 16, 4, dynamic=False)],
        steps=1,
        max_length=3,
        key_range=(0, 30),
    )
    model, _ = h.sharded_model(scenario, world)
    kjt = h.to_kjt(scenario, h.batch_for(scenario, 0, rank))
    out = h.local_outputs(scenario, model(kjt))
    sum(v.sum() for v in out.values()).backward()
    return _threads()


def _train_then_tear_down(rank: int, world: int) -> dict:
    import dist_launch

    during = _train(rank, world)  # the model is garbage now, as after a job's run
    dist_launch.tear_down()
    return {"during": during, "after": _threads()}


def test_destroying_the_group_ends_its_threads():
    for rank, got in enumerate(h.run_world(_train_then_tear_down, 2)):
        assert any(t.startswith(GROUP_THREADS) for t in got["during"]), got["during"]
        left = [t for t in got["after"] if t.startswith(GROUP_THREADS)]
        assert not left, (rank, left)
