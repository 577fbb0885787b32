"""A bad batch on one rank, refused on every rank before the input distribution.

Two gloo ranks train sharded collections (EC and EBC, a static TorchRec table
next to the dynamic ones; SGD and Adam). Between good steps, rank 1 (or both
ranks) feeds a malformed batch: a reserved key, negative lengths, lengths that
do not add up to the values or the stride, float values, weights of the wrong
size, offsets that do not start at 0, values on another device, a NaN weight
(an EC's frequency counter, a weighted EBC's pooling weight), features missing
or in another order than the first batch's, a variable batch size per
feature, an id of a static table's feature outside its rows (-1, or its row
count: TorchRec's kernels would read row 0), a batch without samples; or a
batch each rank would take alone but that differs from rank 0's: weights on
one rank only, int32 values or lengths on one rank, another batch size where
the outputs are pooled. Both ranks catch the error
(the same message, naming rank 1 or the ranks' difference, the case and the
bad value) and go on with good batches; every good step's outputs and every table's rows at the end
(keys, scores, embeddings, optimizer state) equal those of a run that never saw
the bad batches. Without the check the ranks pair mismatched collectives.
"""

import pytest
import torch

from tests.shard import shard_harness as h

T = h.TableSpec
INT64_MIN = -(2**63)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _scenarios():
    from dynamicemb import DynamicEmbScoreStrategy

    lfu = {"score_strategy": DynamicEmbScoreStrategy.LFU}
    ec = h.Scenario(
        name="ec",
        kind="ec",
        tables=[
            T("t0", 40, 4, options=lfu),
            T("s", 16, 4, dynamic=False),
            T("t1", 24, 4, dist_type="hash_roundrobin", options=lfu),
        ],
        steps=4,
        max_length=3,
        key_range=(0, 30),
    )
    ebc = h.Scenario(
        name="ebc",
        kind="ebc",
        tables=[T("t0", 40, 4, options=lfu), T("t1", 24, 3, dist_type="continuous", options=lfu)],
        steps=4,
        max_length=3,
        key_range=(0, 30),
        weighted=True,
        optimizer="adam",
        learning_rate=0.05,
    )
    return [ec, ebc]


# Bad batches: (kind, which ranks feed it). The others feed a good batch of
# their own, refused with the step.
BAD = [
    ("reserved_min", (1,)),
    ("reserved_below_first_valid", (1,)),
    ("negative_length", (1,)),
    ("lengths_sum", (1,)),
    ("lengths_numel", (1,)),
    ("float_values", (1,)),
    ("weights_numel", (1,)),
    ("offsets_start", (1,)),
    ("meta_values", (1,)),
    ("nan_weight", (1,)),
    ("keys_reordered", (1,)),
    ("variable_stride", (1,)),
    ("missing_feature", (1,)),
    ("negative_length", (0, 1)),
    ("static_negative", (1,)),
    ("static_past_rows", (1,)),
    ("no_samples", (1,)),
    ("weights_here_only", (1,)),
    ("int32_values", (1,)),
    ("int32_lengths", (1,)),
    ("other_stride", (1,)),
]
# Batches each rank would take alone, refused for differing between ranks.
DIFFER = "the ranks' batches differ"
# Refused where the outputs are pooled only (an EmbeddingCollection takes
# another batch size on each rank).
POOLED_ONLY = {"other_stride"}


def bad_kinds(scenario):
    static = any(not t.dynamic for t in scenario.tables)
    return [
        (k, r)
        for k, r in BAD
        if (scenario.kind == "ebc" or k not in POOLED_ONLY) and (static or "static" not in k)
    ]


def _kjt(keys, values, lengths=None, weights=None, offsets=None, stride=None):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor(
        keys=keys, values=values, lengths=lengths, weights=weights, offsets=offsets, stride=stride
    )


def bad_batch(scenario, kind: str, rank: int):
    """A malformed batch of ``kind`` and the text its error must hold."""
    from dynamicemb.table import first_valid_key

    good = h.to_kjt(scenario, h.batch_for(scenario, 50, rank))
    keys, values, lengths = good.keys(), good.values(), good.lengths()
    weights = good.weights_or_none()
    # The last value of the last dynamic table's feature.
    f = max(i for i, t in enumerate(scenario.tables) if t.dynamic)
    stride = good.stride()
    end = int(lengths[: (f + 1) * stride].sum())
    assert int(lengths[f * stride : (f + 1) * stride].sum()) > 0
    name = scenario.tables[f].feature
    if kind.startswith("static"):
        s = next(i for i, t in enumerate(scenario.tables) if not t.dynamic)
        start = int(lengths[: s * stride].sum())
        assert int(lengths[s * stride : (s + 1) * stride].sum()) > 0
        rows = scenario.tables[s].num_embeddings
        bad = -1 if kind == "static_negative" else rows
        values = values.clone()
        values[start] = bad
        feature = scenario.tables[s].feature
        want = f"id {bad} at index {start} of feature {feature!r} is not a row of its table, "
        return _kjt(keys, values, lengths, weights), want + f"whose ids lie in [0, {rows})"
    if kind == "no_samples":
        empty = values[:0]
        batch = _kjt(keys, empty, lengths[:0], None if weights is None else weights[:0], stride=0)
        return batch, "has no samples (stride 0)"
    if kind == "weights_here_only":
        if weights is None:
            batch = _kjt(keys, values, lengths, torch.ones(values.numel()))
            return batch, f"{DIFFER} in their weights (rank 0's none, rank 1's torch.float32)"
        batch = _kjt(keys, values, lengths)
        return batch, f"{DIFFER} in their weights (rank 0's torch.float32, rank 1's none)"
    if kind == "int32_values":
        want = f"{DIFFER} in their values dtypes (rank 0's torch.int64, rank 1's torch.int32)"
        return _kjt(keys, values.int(), lengths, weights), want
    if kind == "int32_lengths":
        want = f"{DIFFER} in their lengths dtypes (rank 0's torch.int64, rank 1's torch.int32)"
        return _kjt(keys, values, lengths.int(), weights), want
    if kind == "other_stride":
        # Every feature's last sample dropped: a batch of stride - 1.
        bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        keep = bag % stride != stride - 1
        lengths = lengths.reshape(len(keys), stride)[:, :-1].reshape(-1)
        batch = _kjt(keys, values[keep], lengths, None if weights is None else weights[keep])
        want = f"{DIFFER} in their batch sizes (strides) (rank 0's {stride}, rank 1's {stride - 1})"
        return batch, want
    if kind == "variable_stride":
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        n = values.numel() - int(lengths[-1])
        strides = [[stride]] * (len(keys) - 1) + [[stride - 1]]
        batch = KeyedJaggedTensor(
            keys=keys,
            values=values[:n],
            lengths=lengths[:-1],
            weights=None if weights is None else weights[:n],
            stride_per_key_per_rank=strides,
        )
        return batch, "has a variable batch size per feature"
    if kind == "keys_reordered":
        order = list(range(len(keys)))[::-1]
        return good.permute(order), f"KJT's keys are not the first batch's {list(keys)}"
    if kind == "missing_feature":
        n = int(lengths[: (len(keys) - 1) * stride].sum())
        batch = _kjt(keys[:-1], values[:n], lengths[: (len(keys) - 1) * stride])
        return batch, f"KJT's keys are not the first batch's {list(keys)}"
    if kind == "nan_weight":
        w = torch.ones(values.numel())
        w[end - 1] = float("nan")
        return _kjt(keys, values, lengths, w), f"weights of feature {name!r} are its table's"
    if kind.startswith("reserved"):
        key = INT64_MIN if kind == "reserved_min" else first_valid_key() - 1
        values = values.clone()
        values[end - 1] = key
        return _kjt(
            keys, values, lengths, weights
        ), f"feature {name!r}): key {key} at index {end - 1}"
    if kind == "negative_length":
        lengths = lengths.clone()
        lengths[1] += lengths[0] + 1
        lengths[0] = -1
        return _kjt(
            keys, values, lengths, weights
        ), "lengths must not be negative, got -1 at index 0"
    if kind == "lengths_sum":
        lengths = lengths.clone()
        lengths[-1] += 2
        n = values.numel()
        return _kjt(keys, values, lengths, weights), f"lengths add up to {n + 2}, but there are {n}"
    if kind == "lengths_numel":
        stride = good.stride()
        lengths = lengths[:-1]
        values = values[: int(lengths.sum())]
        weights = None if weights is None else weights[: values.numel()]
        batch = _kjt(keys, values, lengths, weights, stride=stride)
        return batch, f"lengths has {lengths.numel()} entries, not features ({len(keys)})"
    if kind == "float_values":
        return _kjt(
            keys, values.float(), lengths, weights
        ), "must be int32 or int64, got torch.float32"
    if kind == "weights_numel":
        n = values.numel()
        w = torch.ones(n - 1)
        return _kjt(keys, values, lengths, w), f"weights has {n - 1} entries for {n} values"
    if kind == "offsets_start":
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)]) + 1
        batch = _kjt(keys, values, weights=weights, offsets=offsets)
        return batch, "offsets must start at 0, got 1"
    if kind == "meta_values":
        return _kjt(keys, values.to("meta"), lengths, weights), "values are on meta"
    raise ValueError(kind)


def _rows(model) -> dict:
    """Every dynamic table's rows on this rank, by key."""
    from dynamicemb.shard import named_dynamic_embedding_kernels

    out = {}
    for _, kernel in named_dynamic_embedding_kernels(model):
        rows = kernel.emb_module.rows
        for t, name in enumerate(kernel.table_names):
            parts = list(rows.export_rows(t, 1 << 16))
            keys = torch.cat([p.keys for p in parts])
            order = torch.argsort(keys)
            entry = {"keys": keys[order], "step": rows.step}
            for field in ("scores", "embeddings", "optimizer_state"):
                got = [getattr(p, field) for p in parts]
                if got[0] is not None:
                    entry[field] = torch.cat(got)[order].clone()
            out[name] = entry
    return out


def train_with_bad_batches(rank, world_size, scenarios, with_bad):
    """Each scenario's good steps, with the bad batches before the second
    and third good step when ``with_bad``; returns the outputs of the good
    steps, the errors caught and the rows at the end."""
    results = {}
    for scenario in scenarios:
        model, _ = h.sharded_model(scenario, world_size)
        outs, errors = [], []
        for step in range(scenario.steps):
            if with_bad and step in (1, 2):
                for kind, ranks in bad_kinds(scenario):
                    if rank in ranks:
                        batch, want = bad_batch(scenario, kind, rank)
                    else:
                        batch, want = h.to_kjt(scenario, h.batch_for(scenario, 60, rank)), None
                    try:
                        model(batch)
                    except (ValueError, NotImplementedError) as e:
                        errors.append((kind, ranks, want, str(e)))
                    else:
                        errors.append((kind, ranks, want, None))
            kjt = h.to_kjt(scenario, h.batch_for(scenario, step, rank))
            out = h.local_outputs(scenario, model(kjt))
            shapes = {k: tuple(v.shape) for k, v in out.items()}
            targets = h.targets_for(scenario, step, rank, shapes)
            loss = sum(0.5 * ((v.double() - targets[k]) ** 2).sum() for k, v in out.items())
            loss.backward()
            outs.append({k: v.detach().double().clone() for k, v in out.items()})
        results[scenario.name] = {"steps": outs, "errors": errors, "rows": _rows(model)}
    return results


@pytest.fixture(scope="module")
def runs():
    scenarios = _scenarios()
    bad = h.run_world(train_with_bad_batches, 2, scenarios, True)
    clean = h.run_world(train_with_bad_batches, 2, scenarios, False)
    return scenarios, bad, clean


def _assert_same(got, want, what):
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), what
        for k in want:
            _assert_same(got[k], want[k], f"{what} {k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{what}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want), what
    else:
        assert got == want, what


@pytest.mark.parametrize("name", ["ec", "ebc"])
def test_bad_batch_refused_on_every_rank(runs, name):
    scenarios, bad, _ = runs
    scenario = next(s for s in scenarios if s.name == name)
    errors = [bad[r][name]["errors"] for r in range(2)]
    assert len(errors[0]) == len(errors[1]) == 2 * len(bad_kinds(scenario))
    for e0, e1 in zip(*errors):
        kind, ranks, _, msg0 = e0
        msg1, want = e1[3], e0[2] if 0 in ranks else e1[2]
        assert msg0 is not None and msg1 is not None, (kind, "not refused")
        assert msg0 == msg1, (kind, msg0, msg1)  # one verdict, one message
        if not want.startswith(DIFFER):
            assert f"rank {ranks[0]}'s batch" in msg0, (kind, msg0)
        assert want in msg0, (kind, want, msg0)
        assert "refused on every rank" in msg0
        if len(ranks) > 1:
            assert f"also the batches of ranks {list(ranks[1:])}" in msg0


@pytest.mark.parametrize("name", ["ec", "ebc"])
def test_refused_steps_change_nothing(runs, name):
    _, bad, clean = runs
    for r in range(2):
        _assert_same(bad[r][name]["steps"], clean[r][name]["steps"], f"rank {r} outputs")
        _assert_same(bad[r][name]["rows"], clean[r][name]["rows"], f"rank {r} rows")


def test_clean_run_matches_reference(runs):
    scenarios, _, clean = runs
    for scenario in scenarios:
        want = h.reference_outputs(h.Scenario(**{**scenario.__dict__, "eval_step": False}), 2)
        for r in range(2):
            h.assert_matches({"steps": clean[r][scenario.name]["steps"]}, want[r])


# ------------------------------------------------- STEP scores and Adam --


def _step_scenario():
    from dynamicemb import DynamicEmbScoreStrategy

    step = {"score_strategy": DynamicEmbScoreStrategy.STEP}
    return h.Scenario(
        name="ec_step_adam",
        kind="ec",
        tables=[T("t0", 40, 4, options=step), T("t1", 24, 4, options=step)],
        optimizer="adam",
        learning_rate=0.05,
        steps=3,
        max_length=3,
        key_range=(0, 30),
    )


def train_after_refused_first_batch(rank, world_size, scenario, refused):
    """The scenario's steps, the first forward refused (a reserved key in
    the last rank's batch) when ``refused``; the outputs and the rows."""
    model, _ = h.sharded_model(scenario, world_size)
    if refused:
        if rank == world_size - 1:
            batch, _ = bad_batch(scenario, "reserved_min", rank)
        else:
            batch = h.to_kjt(scenario, h.batch_for(scenario, 60, rank))
        with pytest.raises(ValueError, match="is reserved"):
            model(batch)
    outs = []
    for step in range(scenario.steps):
        kjt = h.to_kjt(scenario, h.batch_for(scenario, step, rank))
        out = h.local_outputs(scenario, model(kjt))
        shapes = {k: tuple(v.shape) for k, v in out.items()}
        targets = h.targets_for(scenario, step, rank, shapes)
        sum(0.5 * ((v.double() - targets[k]) ** 2).sum() for k, v in out.items()).backward()
        outs.append({k: v.detach().double().clone() for k, v in out.items()})
    return {"steps": outs, "rows": _rows(model)}


def _last_steps(scenario, world_size: int) -> dict[str, dict[int, int]]:
    """Each table's keys with the last training step (from 1) that looked
    them up on any rank: their STEP scores."""
    last: dict[str, dict[int, int]] = {t.name: {} for t in scenario.tables}
    for step in range(scenario.steps):
        for r in range(world_size):
            batch = h.batch_for(scenario, step, r)
            for t in scenario.tables:
                for keys, _ in batch[t.feature]:
                    for k in keys.tolist():
                        last[t.name][k] = step + 1
    return last


@pytest.mark.parametrize("world_size", [1, 2])
def test_refused_forward_does_not_advance_the_step(world_size):
    scenario = _step_scenario()
    refused = h.run_world(train_after_refused_first_batch, world_size, scenario, True)
    clean = h.run_world(train_after_refused_first_batch, world_size, scenario, False)
    want = h.reference_outputs(h.Scenario(**{**scenario.__dict__, "eval_step": False}), world_size)
    last = _last_steps(scenario, world_size)
    for r in range(world_size):
        # Adam's bias correction counts the good steps only: the outputs
        # match the float64 reference, rows and optimizer state the clean run.
        h.assert_matches({"steps": refused[r]["steps"]}, want[r])
        _assert_same(refused[r]["steps"], clean[r]["steps"], f"rank {r} outputs")
        _assert_same(refused[r]["rows"], clean[r]["rows"], f"rank {r} rows")
        for name, rows in refused[r]["rows"].items():
            assert rows["step"] == scenario.steps, (name, rows["step"])
            keys = rows["keys"].tolist()
            assert keys and all(k in last[name] for k in keys), name
            scores = rows["scores"][:, 0].tolist()
            assert scores == [last[name][k] for k in keys], (name, keys, scores)


def test_the_first_finding_in_priority_order_is_the_one_reported():
    # One batch with a negative length, lengths that do not add up and a
    # reserved key: the verdict names the first of them, with its values,
    # and a batch with only the later ones names the next.
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dynamicemb.shard.batch_checks import BatchCheck
    from dynamicemb.table import first_valid_key

    check = BatchCheck(["f"], torch.device("cpu"), None, ["f"])
    bad_key = first_valid_key() - 1
    values = torch.tensor([5, bad_key, 7], dtype=torch.int64)
    kjt = KeyedJaggedTensor(keys=["f"], values=values, lengths=torch.tensor([2, -3, 2]))
    with pytest.raises(ValueError, match=r"must not be negative, got -3 at index 1"):
        check(kjt)
    kjt = KeyedJaggedTensor(keys=["f"], values=values, lengths=torch.tensor([2, 2, 0]))
    with pytest.raises(ValueError, match=r"lengths add up to 4, but there are 3 values"):
        check(kjt)
    kjt = KeyedJaggedTensor(keys=["f"], values=values, lengths=torch.tensor([2, 1, 0]))
    with pytest.raises(ValueError, match=str(bad_key)):
        check(kjt)
    check(KeyedJaggedTensor(keys=["f"], values=values[[0, 2]], lengths=torch.tensor([1, 1, 0])))
