"""The generic file layer alone: block checksums, verified reads, manifests,
dtype names; each reader raising the error class its caller names."""

import os
import zlib

import pytest
import torch

from dynamicemb.io import Group, dtypes, fs
from dynamicemb.io import files as io_files
from dynamicemb.io.files import DataError, FileInfo


class _Format(ValueError):
    """A caller's own error class."""


def test_block_checksums_and_verified_reads(tmp_path):
    data = os.urandom(1000)
    w = io_files.CheckedWriter(str(tmp_path / "f"), block=64)
    for lo in range(0, 1000, 37):  # writes that straddle blocks
        w.write(data[lo : lo + 37])
    info = w.close()
    assert info.nbytes == 1000
    assert info.crc32 == [zlib.crc32(data[i : i + 64]) for i in range(0, 1000, 64)]
    assert info.crc32 == io_files.crc32_blocks(data, 64)
    out = torch.empty(1000, dtype=torch.uint8)
    io_files.read_verified(str(tmp_path), info, 64, "t", out)
    assert bytes(out.numpy()) == data
    with open(tmp_path / "f", "r+b") as f:
        f.seek(700)
        f.write(b"\x00" if data[700] else b"\x01")
    with pytest.raises(DataError, match="checksum mismatch in block 10"):
        io_files.read_verified(str(tmp_path), info, 64, "t", out)
    with pytest.raises(_Format, match="checksum mismatch in block 10"):
        io_files.read_verified(str(tmp_path), info, 64, "t", out, _Format)
    short = FileInfo(info.name, 1001, info.crc32)
    with pytest.raises(_Format, match="truncated"):
        io_files.read_verified(
            str(tmp_path), short, 64, "t", torch.empty(1001, dtype=torch.uint8), _Format
        )
    with pytest.raises(_Format, match="does not exist"):
        io_files.check_sizes(str(tmp_path), [FileInfo("missing", 3, None)], "t", _Format)


def test_a_published_folder_and_its_manifest(tmp_path):
    path = str(tmp_path / "out")
    tmp = io_files.make_tmp(path)
    io_files.write_small(tmp, "a.json", b"{}")
    io_files.write_manifest(tmp, {"format": "fmt", "version": 3, "x": 1}, "m.json")
    io_files.publish(tmp, path)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    body = io_files.read_manifest(path, "m.json", "fmt", 3)
    assert body["x"] == 1 and "created_unix_ns" in body
    with pytest.raises(_Format, match="is not 'fmt' version 4"):
        io_files.read_manifest(path, "m.json", "fmt", 4, _Format)
    with open(os.path.join(path, "m.json"), "r+b") as f:
        f.seek(0, 2)
        f.seek(f.tell() - 3)
        f.write(b"  ")
    with pytest.raises(_Format, match="manifest"):
        io_files.read_manifest(path, "m.json", "fmt", 3, _Format)
    with pytest.raises(_Format, match="does not exist"):
        io_files.read_manifest(path, "none.json", "fmt", 3, _Format)
    # Arrays nested too deep to parse: refused as any bad manifest.
    depth = 100_000
    with open(os.path.join(path, "m.json"), "wb") as f:
        f.write(b'{"checksum": 1, "x": ' + b"[" * depth + b"]" * depth + b"}")
    with pytest.raises(_Format, match="manifest is not valid \\(RecursionError"):
        io_files.read_manifest(path, "m.json", "fmt", 3, _Format)


def test_dtype_names_round_trip_and_unknown_names_are_refused():
    for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert dtypes.dtype_of(dtypes.dtype_name(d), "t") is d
    with pytest.raises(ValueError, match="cannot be stored"):
        dtypes.dtype_name(torch.int8)
    with pytest.raises(_Format, match="unknown dtype 'float8'"):
        dtypes.dtype_of("float8", "t", _Format)
    assert dtypes.key_dtype_of(dtypes.key_dtype_name(torch.int32), "t") is torch.int32
    with pytest.raises(DataError, match="unknown key dtype"):
        dtypes.key_dtype_of("float32", "t")


def test_names_that_cannot_name_a_file_are_refused():
    for bad in ("", "a/b", ".", "..", "a\0b"):
        with pytest.raises(ValueError, match="cannot name a file"):
            io_files.check_name(bad, "table name")
    io_files.check_name("t_user.v2", "table name")


def test_chunks_and_a_world_of_one():
    assert io_files.chunk_rows(1) == io_files.CHUNK_BYTES
    assert io_files.chunk_rows(1 << 40) == 1024
    g = Group(None, _Format)
    assert (g.rank, g.world_size, g.distributed) == (0, 1, False)
    assert g.all_reduce([3, 4]) == [3, 4] and g.all_gather_object("x") == ["x"]
    with pytest.raises(KeyError):
        g.agree(KeyError("mine"))
    g.agree(None)


def test_a_path_is_resolved_to_its_filesystem_once(tmp_path, monkeypatch):
    """A Location carries its filesystem: publishing a folder into it and
    reading it back resolves nothing again (``fs.of`` once, by ``fs.at``)."""
    calls = []
    real = fs.of
    monkeypatch.setattr(fs, "of", lambda p: calls.append(p) or real(p))
    path = fs.at(str(tmp_path / "pub"))
    tmp = io_files.make_tmp(path)
    io_files.write_small(tmp, "a.json", b"{}")
    w = io_files.CheckedWriter(tmp.join("f"), block=64)
    w.write(b"x" * 100)
    info = w.close()
    io_files.fsync_path(tmp)
    io_files.write_manifest(tmp, {"format": "fmt", "version": 1}, "m.json")
    io_files.publish(tmp, path)
    folder = io_files.committed(path, "m.json")
    assert folder == path and io_files.read_manifest(folder, "m.json", "fmt", 1)
    assert io_files.read_small(folder, None, "a.json", "t") == b"{}"
    io_files.check_sizes(folder, [info], "t")
    out = torch.empty(100, dtype=torch.uint8)
    io_files.read_verified(folder, info, 64, "t", out)
    assert calls == [str(tmp_path / "pub")]
    # A plain path is resolved where it enters.
    io_files.read_small(str(tmp_path / "pub"), None, "a.json", "t")
    assert len(calls) == 2
