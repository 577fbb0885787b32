"""A dump killed with SIGKILL at random points leaves the previous checkpoint
or the new one, never a torn one nor a mixture.

One process trains a small model; before each dump it trains a step, so
every checkpoint differs from the one before. A forked child dumps, and the
parent kills it after a random delay between zero and 1.2 times a forked
dump's duration (measured first), then loads the checkpoint into a second model and compares that
model's tables and admission counters (read from their raw state) with
those of the previous and of the new checkpoint.
"""

import os
import random
import signal
import time

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

KILLS = 60
T = h.TableSpec


def _state(model):
    """The model's tables and admission counters."""
    return {"tables": c.contents(model), "counters": c.counters(model)}


def _same(a, b) -> bool:
    try:
        c.assert_same_tables(a["tables"], b["tables"])
        c.assert_same_counters(a["counters"], b["counters"])
    except AssertionError:
        return False
    return all(a["tables"][n]["step"] == b["tables"][n]["step"] for n in b["tables"])


def _fork_dump(dump, path, model) -> int:
    pid = os.fork()
    if pid == 0:  # the dumping process
        code = 1
        try:
            dump(path, model, optim=True, show_progress=False)
            code = 0
        finally:
            os._exit(code)
    return pid


def _kill_world(rank, world, root, kills, seed):
    import torch

    from dynamicemb.checkpoint import dump, load

    torch.set_num_threads(1)
    case = c.Case(
        "kill",
        "ec",
        [
            T("t0", 64, 4, dist_type="roundrobin"),
            T("t1", 64, 4, dist_type="hash_roundrobin", admit_threshold=2),
        ],
        optimizer="adam",
        key_range=(0, 300),
        batch_size=8,
        max_length=6,
    )
    model, other = c.build(case, world), c.build(case, world)
    path = os.path.join(root, "ckpt")
    c.train(model, case, rank, steps=1)
    dump(path, model, optim=True, show_progress=False)
    durations = []
    for _ in range(3):  # a forked dump's duration, fork and exit included
        start = time.perf_counter()
        pid = _fork_dump(dump, path, model)
        os.waitpid(pid, 0)
        durations.append(time.perf_counter() - start)
    duration = sorted(durations)[1]
    old = _state(model)
    assert old["counters"]["t1"]["keys"].numel() > 0  # the counter files hold keys
    rng = random.Random(seed)
    outcomes = {"old": 0, "new": 0, "child_finished": 0}
    for i in range(kills):
        c.train(model, case, rank, steps=1, first=i + 1)
        new = _state(model)
        pid = _fork_dump(dump, path, model)
        time.sleep(rng.uniform(0.0, 1.2 * duration))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0, f"kill {i}: the dump failed by itself"
            outcomes["child_finished"] += 1
        load(path, other, optim=True, show_progress=False)  # must not fail
        got = _state(other)
        if _same(got, new):
            outcomes["new"] += 1
            old = new
        elif _same(got, old):
            outcomes["old"] += 1
        else:
            raise AssertionError(
                f"kill {i}: the checkpoint is neither the previous nor the new one"
            )
    leftovers = [n for n in os.listdir(root) if n != "ckpt"]
    return {"outcomes": outcomes, "duration": duration, "leftovers": leftovers}


def test_sigkill_during_dump_leaves_old_or_new(tmp_path):
    (result,) = h.run_world(_kill_world, 1, str(tmp_path), KILLS, 20261130)
    outcomes = result["outcomes"]
    assert outcomes["old"] + outcomes["new"] == KILLS
    # Kills landed before and after the new checkpoint was published.
    assert outcomes["old"] > 0 and outcomes["new"] > 0, result
