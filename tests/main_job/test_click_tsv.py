"""The main job's data from files: the Criteo-style TSV format
(examples/click_tsv.py) parsed against hand-written lines, its split over
ranks against the lines read by hand, the sample writer, and the job
training on a sample and resuming at the right line after a kill."""

import gzip
import math
import os
import re

import click_tsv  # examples/click_tsv.py (pyproject: pytest pythonpath)
import job_harness as j
import make_sample_data  # examples/make_sample_data.py
import pytest
import torch
import train_checkpoint  # examples/train_checkpoint.py

INT64_MIN = -(1 << 63)


def _line(label="1", dense=None, ids=None) -> str:
    dense = ["1"] * 13 if dense is None else dense
    ids = ["a"] * 26 if ids is None else ids
    return "\t".join([label, *dense, *ids]) + "\n"


def test_a_line_gives_its_label_dense_features_and_ids():
    dense = ["0", "", "3", "-2", "100"] + ["7"] * 8
    ids = ["68fd1e64", "", "ffffffffffffffff", "8000000000000001", "0"] + ["1f"] * 21
    r = click_tsv.parse_line(_line("0", dense, ids), 16, "x:1")
    assert r.label == 0
    want = [0.0, 0.0, math.log(4.0), 0.0, math.log(101.0)] + [math.log(8.0)] * 8
    assert r.dense == pytest.approx(want, abs=0, rel=1e-15)
    # 64-bit ids wrap to int64; the reserved smallest keys move above them.
    assert r.ids[:5] == [0x68FD1E64, None, -1, INT64_MIN + 1 + 4, 0]
    assert r.ids[5:] == [31] * 21
    decimal = click_tsv.parse_line(_line(ids=["12", "-5"] + [""] * 24), 10, "x:2")
    assert decimal.ids == [12, -5] + [None] * 24


@pytest.mark.parametrize(
    "line, message",
    [
        ("1\t2\n", "x.tsv:7: 2 tab-separated fields, expected 40"),
        (_line(label="2"), "x.tsv:7: label '2' is not 0 or 1"),
        (_line(dense=["1"] * 12 + ["1.5"]), "x.tsv:7: I13 '1.5' is not an integer"),
        (_line(ids=["a"] * 25 + ["xyz"]), "x.tsv:7: C26 'xyz' is not a hexadecimal id"),
        (_line(ids=["1" * 17] + ["a"] * 25), "x.tsv:7: C1 '11111111111111111' does not fit"),
        (
            _line(dense=["9" * 400] + ["1"] * 12),
            "x.tsv:7: I1 '9999999999999999999999999999999999999999'... (400 characters) is "
            "too large a count",
        ),
        (
            _line(ids=["f" * 400] + ["a"] * 25),
            "x.tsv:7: C1 'ffffffffffffffffffffffffffffffffffffffff'... (400 characters) does "
            "not fit in 64 bits",
        ),
        (
            _line(ids=["a", "b\u00e9"] + ["a"] * 24).encode("latin-1"),
            "x.tsv:7: C2 holds the byte 0xe9, which is not ASCII",
        ),
    ],
)
def test_a_bad_line_is_named_with_its_file_line_and_field(line, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        click_tsv.parse_line(line, 16, "x.tsv:7")


@pytest.mark.parametrize("damage", ["truncated", "not_gzip"])
def test_a_damaged_gzip_file_is_named(tmp_path, damage):
    lines = [_line() for _ in range(200)]
    data = gzip.compress("".join(lines).encode())
    path = tmp_path / "part.tsv.gz"
    path.write_bytes(data[: len(data) - 40] if damage == "truncated" else b"plain text\n")
    stream = iter(click_tsv.ClickFiles([str(path)], 4, 0, 1))
    with pytest.raises(ValueError, match=f"^{path}: cannot be read after line \\d+ \\("):
        for _ in range(100):
            next(stream)


def _sample(folder, rows: int, files: int, gz: bool, seed: int = 0) -> list[str]:
    make_sample_data.main(
        ["--out", str(folder), "--rows", str(rows), "--eval-rows", "40", "--files", str(files)]
        + ["--seed", str(seed)]
        + (["--gzip"] if gz else [])
    )
    paths = click_tsv.list_files(os.path.join(folder, "train"))
    assert len(paths) == files and all(p.endswith(".tsv.gz" if gz else ".tsv") for p in paths)
    lines = []
    for p in paths:
        with gzip.open(p, "rt") if gz else open(p) as f:
            lines += f.readlines()
    assert len(lines) == rows
    return lines


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_split_the_stream_line_by_line(tmp_path, world):
    lines = _sample(tmp_path, rows=50, files=3, gz=True)
    batch, steps = 4, 10  # 10 * 4 * world lines: the stream wraps around
    want = [click_tsv.parse_line(s, 16, "") for s in lines]
    for rank in range(world):
        stream = click_tsv.ClickFiles(
            click_tsv.list_files(str(tmp_path / "train")), batch, rank, world
        )
        for step, (dense, values, lengths, labels) in zip(range(steps), stream):
            first = (step * world + rank) * batch
            records = [want[(first + i) % len(want)] for i in range(batch)]
            assert labels.tolist() == [r.label for r in records]
            assert torch.equal(dense, torch.tensor([r.dense for r in records]).float())
            by_feature = [[r.ids[f] for r in records] for f in range(26)]
            assert lengths.tolist() == [int(k is not None) for col in by_feature for k in col]
            assert values.tolist() == [k for col in by_feature for k in col if k is not None]


def test_a_stream_goes_on_from_its_cursor(tmp_path):
    _sample(tmp_path, rows=30, files=2, gz=False)
    files = click_tsv.list_files(str(tmp_path / "train"))
    whole = click_tsv.ClickFiles(files, 4, 1, 2)
    batches = [next(iter_) for iter_ in [iter(whole)] for _ in range(9)]  # wraps at step 3
    again = click_tsv.ClickFiles(files, 4, 1, 2)
    it = iter(again)
    for _ in range(5):
        next(it)
    cursor = click_tsv.Cursor.from_json(again.cursor.to_json())
    assert cursor == click_tsv.Cursor(epoch=1, file=0, line=10)  # 40 lines of 30, in 15 + 15
    resumed = iter(click_tsv.ClickFiles(files, 4, 1, 2, cursor=cursor))
    for b in batches[5:]:
        for x, y in zip(next(resumed), b):
            assert torch.equal(x, y)


def test_missing_data_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere: no such file or folder"):
        click_tsv.list_files(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no .tsv or .tsv.gz file"):
        click_tsv.list_files(str(tmp_path / "empty"))


# ------------------------------------------------------------ the job --

STEPS, EVERY = 20, 10


def test_the_job_trains_on_files_and_resumes_at_the_right_line(tmp_path):
    _sample(tmp_path / "data", rows=3000, files=2, gz=True, seed=3)
    data = ["--data", str(tmp_path / "data" / "train"), "--eval-data"]
    data += [str(tmp_path / "data" / "eval"), "--table-capacity", "4096"]
    argv = j.SMALL + data + ["--world-size", "2", "--steps", str(STEPS)]
    argv += ["--checkpoint-every", str(EVERY)]

    ref, ref_summary = str(tmp_path / "ref"), str(tmp_path / "ref.json")
    rc, out = j.run_job([*argv, "--checkpoint-dir", ref, "--summary-json", ref_summary])
    assert rc in (0, 1), out[-4000:]  # 1: the loss did not fall in so few steps
    s = j.summary(ref_summary)
    assert s["data"] == {
        "source": "files",
        "files": ["part-00000.tsv.gz", "part-00001.tsv.gz"],
        "id_format": "hex",
    }
    assert list(s["tables"]) == [f"t_c{i}" for i in range(1, 27)]
    assert s["eval_loss_final"] is not None and s["eval_loss_hidden_model"] is None
    assert f"data 2 file(s) from {tmp_path / 'data' / 'train'}" in out

    root = str(tmp_path / "ckpt")
    rc, out = j.run_job([*argv, "--checkpoint-dir", root, "--crash-at", "step:15:1"])
    assert rc != 0 and "SIGKILL" in out, out[-4000:]
    summary = str(tmp_path / "resumed.json")
    rc, out = j.run_job([*argv, "--checkpoint-dir", root, "--resume", "--summary-json", summary])
    assert rc in (0, 1), out[-4000:]
    resumed = j.summary(summary)
    assert resumed["resumed"]["step"] == EVERY
    got = j.read_checkpoint(train_checkpoint.step_dir(root, STEPS), str(tmp_path))
    want = j.read_checkpoint(train_checkpoint.step_dir(ref, STEPS), str(tmp_path))
    # 20 steps of 2 x 64 lines: line 2560 of 3000, in the second file.
    position = torch.load(
        os.path.join(train_checkpoint.step_dir(root, STEPS), train_checkpoint.TRAINER),
        weights_only=True,
    )["data_position"]
    assert position == {"cursor": [0, 1, 2560 - 1500]}
    j.assert_same_state(got, want, "resumed on files")
    for k in ("train_loss_last", "eval_loss_final", "eval_auc_final"):
        assert resumed[k] == s[k], k
