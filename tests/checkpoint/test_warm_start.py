"""Warm start: a TorchRec EmbeddingCollection's and EmbeddingBagCollection's
rows in dynamic tables. After ``warm_start``, the dynamic model's outputs
equal the static model's on the same ids, bit for bit, from a state_dict at
one and two gloo ranks, from the torch.distributed.checkpoint folder of a
static model sharded at one rank into a dynamic model of two, and with a
user id map (row i becomes key ids[i]); pooled sums of rows sharded over two
ranks agree within float32 rounding (the ranks' partial sums are added in
another order). A table the source lacks, a dim
that differs, a weight without rows or of an integer or bool dtype, a bad id
map, an empty, truncated, foreign or corrupted (a flipped byte) file and a
DCP folder whose metadata would run code are errors naming them, and change
nothing (and run nothing)."""

import os

import pytest
import torch

from tests.checkpoint import ckpt_harness as c
from tests.shard import shard_harness as h

T = h.TableSpec
ROWS = 64


def _case(kind: str, dynamic: bool = True) -> c.Case:
    dim1 = 4 if kind == "ec" else 8  # an EmbeddingCollection has one dim
    return c.Case(
        f"warm_{kind}",
        kind,
        [
            T("t0", ROWS, 4, dynamic=dynamic, dist_type="roundrobin"),
            T("t1", ROWS, dim1, dynamic=dynamic, dist_type="hash_roundrobin"),
            T("t2", ROWS, 4, dynamic=dynamic, dist_type="continuous"),
        ],
        optimizer="sgd",
        key_range=(0, ROWS),
        batch_size=4,
        max_length=5,
    )


def _static(kind: str) -> torch.nn.Module:
    """The unsharded TorchRec collection (its own random rows)."""
    coll = h.build_collection(_case(kind).scenario(), torch.device("cpu"))
    torch.manual_seed(7)
    with torch.no_grad():
        for p in coll.parameters():
            p.uniform_(-1.0, 1.0)
    return coll


def _outputs(module, case: c.Case, rank: int, shift=None) -> list[dict[str, torch.Tensor]]:
    """The local outputs of three batches of ``rank`` (keys mapped by
    ``shift``, a table -> ids tensor, when given)."""
    sc = case.scenario()
    out = []
    for step in range(3):
        batch = h.batch_for(sc, step, rank)
        if shift is not None:
            batch = {
                f: [(shift[f[2:]][k] if f[2:] in shift else k, w) for k, w in samples]
                for f, samples in batch.items()
            }
        with torch.no_grad():
            out.append(h.local_outputs(sc, module(h.to_kjt(sc, batch))))
    return out


def _assert_equal(got, want, what: str, exact: bool = True) -> None:
    """Equal outputs; ``exact`` False: within float32 rounding (pooled sums
    of rows sharded over ranks add the ranks' partial sums in another order)."""
    assert len(got) == len(want), what
    for step, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w), what
        for k in w:
            if exact:
                assert torch.equal(g[k], w[k]), f"{what}: step {step} {k} differs"
            else:
                torch.testing.assert_close(g[k], w[k], rtol=1e-6, atol=1e-6, msg=what)


def _warm(kind: str, world: int, source, **kw):
    from dynamicemb.checkpoint import warm_start

    model = c.build(_case(kind), world)
    report = warm_start(model, source, **kw)
    model.eval()
    return model, report


def _one_rank(rank, world, root):
    from dynamicemb.checkpoint import warm_start

    checks = c.Checks()
    for kind in ("ec", "ebc"):
        static = _static(kind)

        @checks(f"{kind}: state_dict")
        def _():
            model, report = _warm(kind, world, static.state_dict())
            assert [(t.table, t.checkpoint_rows, t.loaded, t.dropped) for t in report.tables] == [
                (n, ROWS, ROWS, 0) for n in ("t0", "t1", "t2")
            ]
            _assert_equal(
                _outputs(model, _case(kind), rank), _outputs(static, _case(kind), rank), kind
            )

        @checks(f"{kind}: a torch.save file, tables by name")
        def _():
            path = os.path.join(root, f"{kind}.pt")
            torch.save({"sparse.coll." + k: v for k, v in static.state_dict().items()}, path)
            model, _ = _warm(kind, world, path, tables={"t0": "t0", "t1": "t1", "t2": "t2"})
            _assert_equal(
                _outputs(model, _case(kind), rank), _outputs(static, _case(kind), rank), kind
            )

    static = _static("ec")
    sd = static.state_dict()

    @checks("id map")
    def _():
        g = torch.Generator().manual_seed(3)
        ids = torch.randperm(10_000, generator=g)[:ROWS].to(torch.int64) + 5
        model, _ = _warm("ec", world, sd, id_maps={"t1": ids})
        # The dynamic model's key ids[i] is the static model's row i.
        got = _outputs(model, _case("ec"), rank, shift={"t1": ids})
        _assert_equal(got, _outputs(static, _case("ec"), rank), "id map")

    @checks("errors change nothing")
    def _():
        model, _ = _warm("ec", world, sd)
        before = c.contents(model)
        bad = dict(sd)
        bad["embeddings.t1.weight"] = torch.zeros(ROWS, 5)
        cases = [
            (dict(source=sd, tables=["nope"]), "no dynamic table 'nope'"),
            (dict(source={"embeddings.t0.weight": sd["embeddings.t0.weight"]}), "no table 't1'"),
            (dict(source=bad), r"embeddings.t1.weight has shape \(64, 5\), the table's dim is 4"),
            (dict(source=sd, id_maps={"t0": torch.arange(3)}), "has 3 ids for the source's 64"),
            (dict(source=sd, id_maps={"t0": torch.zeros(ROWS, dtype=torch.int64)}), "repeats"),
            (dict(source=sd, tables={"t0": "t9"}), "no table 't9'"),
            (
                dict(source=dict(sd, **{"embeddings.t0.weight": torch.zeros(0, 4)})),
                r"embeddings.t0.weight has no rows \(shape \(0, 4\)\)",
            ),
        ]
        for dtype in (torch.int64, torch.bool):
            weight = sd["embeddings.t2.weight"].to(dtype)
            message = f"embeddings.t2.weight is {dtype}, not a floating-point weight"
            cases.append((dict(source=dict(sd, **{"embeddings.t2.weight": weight})), message))
        # Files torch.load cannot read, or would read wrong: named, not torch's error.
        saved = os.path.join(root, "good.pt")
        torch.save(dict(sd), saved)
        data = open(saved, "rb").read()
        for name, content, message in (
            ("empty.pt", b"", "empty.pt is not a state_dict torch.save wrote"),
            ("cut.pt", data[: len(data) // 2], "cut.pt is (a damaged zip file|not a state_dict)"),
            ("text.pt", b"not a checkpoint\n" * 8, "text.pt is not a state_dict torch.save wrote"),
        ):
            with open(os.path.join(root, name), "wb") as f:
                f.write(content)
            cases.append((dict(source=os.path.join(root, name)), message))
        # A flipped byte in a stored tensor: torch.load would not notice.
        at = data.index(sd["embeddings.t0.weight"].numpy().tobytes()[:16])
        flipped = bytearray(data)
        flipped[at] ^= 0x40
        with open(os.path.join(root, "flipped.pt"), "wb") as f:
            f.write(bytes(flipped))
        cases.append((dict(source=os.path.join(root, "flipped.pt")), "fails its CRC-32"))
        for kw, message in cases:
            with pytest.raises(ValueError, match=message):
                warm_start(model, **kw)
        # A DCP folder whose metadata would call open(marker): refused by
        # name, and nothing ran.
        import pickle

        import torch.distributed.checkpoint as dcp

        from dynamicemb.checkpoint import CheckpointError

        crafted, marker = os.path.join(root, "crafted"), os.path.join(root, "ran")
        dcp.save(dict(sd), checkpoint_id=crafted)

        class Payload:
            def __reduce__(self):
                return (open, (marker, "w"))

        with open(os.path.join(crafted, ".metadata"), "wb") as f:
            f.write(pickle.dumps(Payload()))
        with pytest.raises(CheckpointError, match="asks for io.open"):
            warm_start(model, crafted)
        assert not os.path.exists(marker)
        c.assert_same_tables(c.contents(model), before, what="after the errors")

    @checks("a static model of one rank, saved with DCP")
    def _():
        import torch.distributed.checkpoint as dcp

        for kind in ("ec", "ebc"):
            static_model = c.build(_case(kind, dynamic=False), world)
            dcp.save({"model": static_model.state_dict()}, checkpoint_id=os.path.join(root, kind))
            static_model.eval()
            for r in (0, 1):  # the batches of both ranks of the dynamic model
                torch.save(
                    _outputs(static_model, _case(kind), r), os.path.join(root, f"{kind}.{r}.out")
                )

    return checks.results


def _two_ranks(rank, world, root):
    checks = c.Checks()
    for kind in ("ec", "ebc"):

        @checks(f"{kind}: state_dict")
        def _():
            static = _static(kind)
            model, report = _warm(kind, world, static.state_dict())
            assert [t.loaded for t in report.tables] == [ROWS] * 3
            want = _outputs(static, _case(kind), rank)
            _assert_equal(_outputs(model, _case(kind), rank), want, kind, exact=kind == "ec")

        @checks(f"{kind}: DCP of a static model of one rank")
        def _():
            model, report = _warm(kind, world, os.path.join(root, kind))
            assert [t.loaded for t in report.tables] == [ROWS] * 3
            want = torch.load(os.path.join(root, f"{kind}.{rank}.out"), weights_only=True)
            got = _outputs(model, _case(kind), rank)
            _assert_equal(got, want, f"{kind} from DCP", exact=kind == "ec")

    return checks.results


def test_warm_start_at_one_and_two_ranks(tmp_path):
    root = str(tmp_path)
    one = c.run_checks(
        _one_rank,
        root,
        [
            "ec: state_dict",
            "ec: a torch.save file, tables by name",
            "ebc: state_dict",
            "ebc: a torch.save file, tables by name",
            "id map",
            "errors change nothing",
            "a static model of one rank, saved with DCP",
        ],
    )
    assert all(v == "ok" for v in one.values()), "\n".join(v for v in one.values() if v != "ok")
    two = h.run_world(_two_ranks, 2, root)
    for results in two:
        assert all(v == "ok" for v in results.values()), "\n".join(
            v for v in results.values() if v != "ok"
        )
