"""The file layer alone: block checksums, verified reads, publishing and the
recovery of a dump that stopped between its two renames; the score order a
load ranks keys by."""

import os
import zlib

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb.checkpoint import files
from dynamicemb.checkpoint.layout import MANIFEST, CheckpointError, FileInfo
from dynamicemb.embedding.score_function import evaluate_scores, table_score_columns


def test_block_checksums_and_verified_reads(tmp_path):
    data = os.urandom(1000)
    w = files.CheckedWriter(str(tmp_path / "f"), block=64)
    for lo in range(0, 1000, 37):  # writes that straddle blocks
        w.write(data[lo : lo + 37])
    info = w.close()
    assert info.nbytes == 1000
    assert info.crc32 == [zlib.crc32(data[i : i + 64]) for i in range(0, 1000, 64)]
    out = torch.empty(1000, dtype=torch.uint8)
    files.read_verified(str(tmp_path), info, 64, "t", out)
    assert bytes(out.numpy()) == data
    with open(tmp_path / "f", "r+b") as f:
        f.seek(700)
        f.write(b"\x00" if data[700] else b"\x01")
    with pytest.raises(CheckpointError, match="checksum mismatch in block 10"):
        files.read_verified(str(tmp_path), info, 64, "t", out)
    short = FileInfo(info.name, 1001, info.crc32)
    with pytest.raises(CheckpointError, match="truncated"):
        files.read_verified(str(tmp_path), short, 64, "t", torch.empty(1001, dtype=torch.uint8))


def _checkpoint(folder: str, tag: str) -> None:
    os.makedirs(folder)
    with open(os.path.join(folder, "content"), "w") as f:
        f.write(tag)
    files.write_manifest(folder, {"format": "dynamicemb-checkpoint", "version": 1, "tag": tag})


def test_publish_replaces_and_a_stopped_swap_is_recovered(tmp_path):
    path = str(tmp_path / "ckpt")
    for tag in ("one", "two"):
        files.prepare_target(path)
        tmp = files.make_tmp(path)
        os.rmdir(tmp)  # _checkpoint makes it
        _checkpoint(tmp, tag)
        files.publish(tmp, path)
        folder, manifest = files.resolve(path)
        assert folder == path and manifest["tag"] == tag
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    # A dump stopped between its renames: the old one moved aside, the new
    # one complete beside it, no <path>. A load reads the newest complete one.
    old = path + files.OLD_TAG + files.new_token()
    os.rename(path, old)
    new = path + files.TMP_TAG + files.new_token()
    _checkpoint(new, "three")
    unfinished = path + files.TMP_TAG + files.new_token()
    os.makedirs(unfinished)  # no manifest: never chosen
    folder, manifest = files.resolve(path)
    assert folder == new and manifest["tag"] == "three"
    # The next dump puts it back at <path> first and removes the rest.
    files.prepare_target(path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert files.resolve(path)[1]["tag"] == "three"
    assert os.path.isfile(os.path.join(path, MANIFEST))


def test_resolve_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no dynamicemb checkpoint"):
        files.resolve(str(tmp_path / "none"))


def test_score_columns_and_function_order():
    assert table_score_columns((S.TIMESTAMP, S.LFU)) == [1, 0]
    assert table_score_columns((S.LFU, S.TIMESTAMP)) == [0, 1]
    assert table_score_columns((S.LFU,)) == [0]

    def fn(scores, now):
        return float(scores[1]) - 0.001 * float(now - scores[0])

    scores = torch.tensor([[5, 3], [9, 1], [1, 7]], dtype=torch.int64)
    got = evaluate_scores(fn, scores, 10)
    want = torch.tensor([fn(tuple(r), 10) for r in scores.tolist()], dtype=torch.float64)
    assert torch.equal(got, want)
