"""Where a checkpoint is: publishing and the recovery of a dump that stopped
between its two renames; the score order a load ranks keys by. (The file
layer's checksums: tests/io.)"""

import os

import pytest
import torch

from dynamicemb import DynamicEmbScoreStrategy as S
from dynamicemb.checkpoint import files
from dynamicemb.checkpoint.layout import MANIFEST, CheckpointError
from dynamicemb.io import files as io_files
from dynamicemb.storage.score_function import evaluate_scores, table_score_columns


def _checkpoint(folder: str, tag: str) -> None:
    os.makedirs(folder)
    with open(os.path.join(folder, "content"), "w") as f:
        f.write(tag)
    io_files.write_manifest(
        folder, {"format": "dynamicemb-checkpoint", "version": 1, "tag": tag}, MANIFEST
    )


def test_publish_replaces_and_a_stopped_swap_is_recovered(tmp_path):
    path = str(tmp_path / "ckpt")
    for tag in ("one", "two"):
        files.prepare_target(path)
        tmp = io_files.make_tmp(path)
        os.rmdir(tmp)  # _checkpoint makes it
        _checkpoint(tmp, tag)
        io_files.publish(tmp, path)
        folder, manifest = files.resolve(path)
        assert folder == path and manifest["tag"] == tag
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    # A dump stopped between its renames: the old one moved aside, the new
    # one complete beside it, no <path>. A load reads the newest complete one.
    old = path + io_files.OLD_TAG + io_files.new_token()
    os.rename(path, old)
    new = path + io_files.TMP_TAG + io_files.new_token()
    _checkpoint(new, "three")
    unfinished = path + io_files.TMP_TAG + io_files.new_token()
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


def _resolutions(rank, world, root):
    """How often a dump and a load resolve a path to its filesystem."""
    from dynamicemb.checkpoint import dump, load
    from dynamicemb.io import fs
    from tests.checkpoint import ckpt_harness as c
    from tests.shard import shard_harness as h

    case = c.Case("paths", "ec", [h.TableSpec("t0", 64, 4)], key_range=(0, 100))
    model = c.build(case, world)
    c.train(model, case, rank, steps=1)
    calls, real = [], fs.of
    fs.of = lambda p: calls.append(str(p)) or real(p)
    try:
        path = os.path.join(root, "ckpt")
        dump(path, model, optim=True, show_progress=False)
        dumped = list(calls)
        load(path, model, optim=True, show_progress=False)
    finally:
        fs.of = real
    return dumped, calls[len(dumped) :]


def test_a_dump_and_a_load_resolve_the_path_once(tmp_path):
    from tests.shard import shard_harness as h

    path = os.path.join(str(tmp_path), "ckpt")
    for dumped, loaded in h.run_world(_resolutions, 2, str(tmp_path)):
        assert dumped == [path] and loaded == [path]
