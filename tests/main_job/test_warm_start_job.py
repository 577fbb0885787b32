"""--warm-start: the job's dynamic tables start from a TorchRec
EmbeddingBagCollection's rows (a state_dict saved with torch.save): after
two steps at two ranks the checkpoint holds every source row as key i,
unchanged (the job's hashed ids never hit keys 0..n-1); a source whose dim
differs is refused naming the table and both shapes, a file torch.load
cannot read naming the file."""

import os

import job_harness as j
import torch
import train_checkpoint  # examples/train_checkpoint.py
import train_dlrm  # examples/train_dlrm.py

DIM = 16  # the job's default --dim
ARGS = [*j.SMALL, "--world-size", "2", "--steps", "2"]


def _source(path: str, dim: int = DIM) -> dict[str, torch.Tensor]:
    """A state_dict of the job's dynamic tables (as a DLRM holds them) with
    a few random rows each."""
    g = torch.Generator().manual_seed(5)
    rows = {}
    for f in train_dlrm.FEATURES:
        if f.dynamic:
            rows[f.table] = torch.randn(37, dim, generator=g)
    torch.save({f"sparse_arch.embedding_bags.{t}.weight": w for t, w in rows.items()}, path)
    return rows


def test_the_job_starts_from_a_static_models_rows(tmp_path):
    source = str(tmp_path / "static.pt")
    rows = _source(source)
    root = str(tmp_path / "ckpt")
    summary = str(tmp_path / "summary.json")
    rc, out = j.run_job(
        [*ARGS, "--checkpoint-dir", root, "--warm-start", source, "--summary-json", summary]
    )
    # 1: the loss of two steps need not fall (the job's verdict); the run finished.
    assert rc in (0, 1) and os.path.isfile(summary), out[-4000:]
    assert f"warm start from {source}: rows " in out
    s = j.summary(summary)
    assert s["warm_start"]["rows"] == dict.fromkeys(rows, 37)
    tables = j.read_tables(
        os.path.join(train_checkpoint.step_dir(root, 2), train_checkpoint.TABLES)
    )
    for name, want in rows.items():
        t = tables[name]
        small = (t["keys"] >= 0) & (t["keys"] < want.shape[0])
        assert torch.equal(t["keys"][small], torch.arange(want.shape[0])), name
        assert torch.equal(t["emb"][small], want), name


def test_a_source_of_another_dim_is_refused(tmp_path):
    source = str(tmp_path / "static.pt")
    _source(source, dim=8)
    rc, out = j.run_job([*ARGS, "--warm-start", source])
    assert rc != 0
    assert f"error: --warm-start {source}: warm_start: table 't_user'" in out, out[-3000:]
    assert "has shape (37, 8), the table's dim is 16" in out
    rc, out = j.run_job([*ARGS, "--warm-start", str(tmp_path / "none.pt")])
    assert rc != 0 and "does not exist" in out
    # A file torch.load cannot read: the job's message naming it, not torch's
    # traceback.
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    rc, out = j.run_job([*ARGS, "--warm-start", str(empty)])
    assert rc != 0 and "Traceback" not in out, out[-3000:]
    assert f"error: --warm-start {empty}: " in out and "is not a state_dict" in out, out[-3000:]
