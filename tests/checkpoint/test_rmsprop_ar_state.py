"""Row-wise RMSprop AR's optimizer state through checkpoints and deltas.

Its update reads, per row, the EMA of mean(g^2), the step of the row's last
update and the row's updates since insertion (the warm-up), and the module's
step: a model loaded with ``optim=True`` must train on exactly like the one
that wrote the checkpoint, and one loaded without the state must not (the
state is what makes the difference). Files and deltas carry the three words
the update uses of the 16 bytes a row reserves; a replica replaying deltas
with their optimizer state holds the source's.
"""

import json
import os

import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
NAME = "t0"
USED = 3  # the state words the update reads and writes


def _case() -> c.Case:
    from dynamicemb import DynamicEmbScoreStrategy

    return c.Case(
        "rmsprop_ar",
        "ec",
        [T(NAME, 64, 8, dist_type="roundrobin"), T("t1", 48, 8, dist_type="hash_roundrobin")],
        optimizer="rmsprop_ar",
        score_strategy=DynamicEmbScoreStrategy.STEP,
        steps=5,
        key_range=(-20, 120),
        batch_size=6,
    )


def _world(rank, world, root):
    from dynamicemb import DynamicEmbDump, DynamicEmbLoad, ReplayContent
    from dynamicemb.incremental_dump import get_score, incremental_dump, replay_increment

    case = _case()
    model = c.build(case, world)
    threshold = get_score(model)
    c.train(model, case, rank)
    out = {"trained": c.contents(model)}
    DynamicEmbDump(root, model, optim=True)
    delta = incremental_dump(model, threshold)[c.COLLECTION]
    i = delta.table_names.index(NAME)
    out["delta"] = {"keys": delta.keys[i], "state": delta.optimizer_states[i]}
    replica = c.build(case, world)
    replay_increment(replica, {c.COLLECTION: delta}, ReplayContent.ALL)
    out["replica"] = c.contents(replica)
    for optim in (True, False):
        fresh = c.build(case, world)
        DynamicEmbLoad(root, fresh, optim=optim)
        out[f"loaded_{optim}"] = c.contents(fresh)
        c.train(fresh, case, rank, steps=3, first=20)
        out[f"loaded_{optim}_after"] = c.contents(fresh)
    c.train(model, case, rank, steps=3, first=20)
    out["after"] = c.contents(model)
    return out


def test_rmsprop_ar_state_survives_checkpoints_and_deltas(tmp_path):
    root = str(tmp_path)
    (out,) = h.run_world(_world, 1, root)
    trained = out["trained"][NAME]
    n = trained["keys"].numel()
    assert trained["opt"].shape == (n, 4)
    # The EMA, the last step (1..5) and the updates (1..5) of every row.
    assert trained["opt"][:, 0].gt(0).all()
    assert trained["opt"][:, 1].ge(1).all() and trained["opt"][:, 1].le(5).all()
    assert trained["opt"][:, 2].ge(1).all() and trained["opt"][:, 2].le(5).all()
    assert not trained["opt"][:, 3].any()
    with open(os.path.join(root, c.COLLECTION, f"{NAME}_meta.json")) as f:
        meta = json.load(f)
    assert meta["optim_state_dim"] == USED and meta["optimizer"] == "ROWWISE_RMSPROP_AR"
    # Loaded with its state: the same rows, and the same training after.
    c.assert_same_tables(out["loaded_True"], out["trained"], what="loaded")
    c.assert_same_tables(out["loaded_True_after"], out["after"], what="trained on")
    # Without it, the steps after differ (fresh state: no decay, a new warm-up).
    assert not torch.equal(out["loaded_False_after"][NAME]["emb"], out["after"][NAME]["emb"])
    # A delta carries the three words; the replica holds the source's state.
    delta = out["delta"]
    assert delta["state"].shape == (delta["keys"].numel(), USED)
    order = torch.argsort(delta["keys"])
    idx = torch.searchsorted(trained["keys"], delta["keys"][order])
    assert torch.equal(trained["keys"][idx], delta["keys"][order])
    assert torch.equal(delta["state"][order], trained["opt"][idx, :USED])
    c.assert_same_tables(out["replica"], out["trained"], what="replica")
