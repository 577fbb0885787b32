"""A sharded model says what its capacity is when it differs from what was
asked, and names the table whose inserts fail (gloo, two ranks): a table of
num_embeddings=8 holds whole buckets of 128 rows per rank, and a batch of 1024
distinct ids a rank cannot place 896 of them."""

import warnings

import torch

from tests.shard import shard_harness as h

T = h.TableSpec


def _said(rank: int, world_size: int) -> dict:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    scenario = h.Scenario(
        name="tiny",
        kind="ec",
        tables=[T("tiny", 8, 4, initializer="uniform"), T("roomy", 4096, 4)],
        use_planner=True,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _ = h.sharded_model(scenario, world_size)
        # Every rank sends 1024 distinct ids to "tiny" (the ids of all ranks
        # distinct: each rank receives 1024 of the 2048) and one to "roomy".
        ids = torch.arange(1024) * world_size + rank
        kjt = KeyedJaggedTensor(
            keys=["f_tiny", "f_roomy"],
            values=torch.cat([ids, torch.tensor([rank])]),
            lengths=torch.tensor([1024] + [0] * 1023 + [1] + [0] * 1023),
        )
        for _ in range(2):
            out = model(kjt)
            sum(out[f].values().sum() for f in out.keys()).backward()
    messages = [str(w.message) for w in caught]
    rounded = [m for m in messages if "num_embeddings=8 gives" in m]
    failed = [m for m in messages if "could not be inserted" in m]
    return {"rounded": rounded, "failed": failed}


def test_rounded_capacity_and_insert_failures_are_said_by_table_name():
    results = h.run_world(_said, 2)
    # Rounded up: said on rank 0 only, once, with the name, asked and got
    # (the planner and the sharder both prepare the options).
    assert len(results[0]["rounded"]) == 1, results[0]["rounded"]
    assert results[1]["rounded"] == []
    said = results[0]["rounded"][0]
    assert "'tiny'" in said and "gives 256 rows (128 per rank on 2 ranks" in said
    assert "bucket_capacity=128" in said and "num_embeddings=256" in said
    # Failures: once per rank, naming the table, the rank, the count and the fix.
    for rank, r in enumerate(results):
        assert len(r["failed"]) == 1, r["failed"]
        msg = r["failed"][0]
        assert msg.startswith("896 keys could not be inserted into dynamic table 'tiny'"), msg
        assert f"on rank {rank}" in msg and "num_embeddings" in msg
