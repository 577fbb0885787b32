"""The file layer on an S3 endpoint (s3fs against moto's server): checked
writes and verified reads, manifests, the version prefixes that a manifest
commits where nothing can be renamed, a folder copied there whole; plain
paths and file:// URLs stay local; a URL whose package is missing names it."""

import os
import zlib

import fsspec
import pytest
import torch

from dynamicemb.io import files, fs
from dynamicemb.io.files import DataError, FileInfo

FMT, VERSION, MANIFEST = "fmt", 1, "m.json"


def _publish(path: str, tag: str, crash_before_manifest: bool = False) -> str:
    tmp = files.make_tmp(path)
    files.write_small(tmp, "content", tag.encode())
    if crash_before_manifest:
        return tmp
    files.write_manifest(tmp, {"format": FMT, "version": VERSION, "tag": tag}, MANIFEST)
    files.publish(tmp, path)
    return tmp


def _tag(path: str) -> str | None:
    folder = files.committed(path, MANIFEST)
    if folder is None:
        return None
    tag = files.read_manifest(folder, MANIFEST, FMT, VERSION)["tag"]
    assert files.read_small(folder, None, "content", "t").decode() == tag
    return tag


def test_checked_files_round_trip(s3):
    root = s3.bucket() + "/data"
    data = os.urandom(1000)
    w = files.CheckedWriter(root + "/f", block=64)
    for lo in range(0, 1000, 37):
        w.write(data[lo : lo + 37])
    info = w.close()
    assert info.crc32 == files.crc32_blocks(data, 64)
    out = torch.empty(1000, dtype=torch.uint8)
    files.read_verified(root, info, 64, "t", out)
    assert bytes(out.numpy()) == data
    s3fs = fsspec.filesystem("s3")
    s3fs.pipe_file(root + "/f", data[:700] + bytes([data[700] ^ 1]) + data[701:])
    with pytest.raises(DataError, match="checksum mismatch in block 10"):
        files.read_verified(root, info, 64, "t", out)
    with pytest.raises(DataError, match="does not exist"):
        files.check_sizes(root, [FileInfo("missing", 3, None)], "t")
    with pytest.raises(DataError, match="has 1000 bytes"):
        files.check_sizes(root, [FileInfo("f", 999, None)], "t")
    # An aborted writer leaves no object.
    w = files.CheckedWriter(root + "/g", block=64)
    w.write(b"partial")
    w.abort()
    assert not fs.of(root).exists(root + "/g")
    small = files.write_small(root, "s", b"abc")
    assert small.crc32 == [zlib.crc32(b"abc")]
    with pytest.raises(DataError, match="corrupted or truncated"):
        files.read_small(root, FileInfo("s", 4, small.crc32), "s", "t")


def test_a_manifest_commits_a_version_and_publish_removes_the_others(s3):
    path = s3.bucket() + "/out"
    store = fs.of(path)
    assert not store.renames and files.committed(path, MANIFEST) is None
    first = _publish(path, "one")
    assert first == path + "/" + files.VERSION_TAG + "00000001"
    assert _tag(path) == "one"
    # A writer that died before its manifest: ignored, the old one reads.
    torn = _publish(path, "two", crash_before_manifest=True)
    assert torn.endswith("00000002") and _tag(path) == "one"
    # The next version is numbered above the torn one; once its manifest is
    # in, the older versions go.
    third = _publish(path, "three")
    assert third.endswith("00000003") and _tag(path) == "three"
    assert store.listdir(path) == [files.VERSION_TAG + "00000003"]
    # Both committed: the higher one is read (a crash before the clean-up).
    fourth = files.make_tmp(path)
    files.write_small(fourth, "content", b"four")
    files.write_manifest(fourth, {"format": FMT, "version": VERSION, "tag": "four"}, MANIFEST)
    assert _tag(path) == "four"
    files.publish(fourth, path)
    assert store.listdir(path) == [files.VERSION_TAG + "00000004"]


def test_committed_children_in_one_listing(s3):
    root = s3.bucket() + "/stream"
    for name in ("a", "b", "c"):
        _publish(f"{root}/{name}", name)
    _publish(f"{root}/d", "d", crash_before_manifest=True)
    # A folder copied in whole (no version prefix) reads too.
    fs.of(root).write_bytes(f"{root}/e/content", b"e")
    files.write_manifest(f"{root}/e", {"format": FMT, "version": VERSION}, MANIFEST)
    got = files.committed_children(root, MANIFEST)
    assert sorted(got) == ["a", "b", "c", "e"]
    assert got["a"] == f"{root}/a/{files.VERSION_TAG}00000001" and got["e"] == f"{root}/e"
    assert files.committed(f"{root}/e", MANIFEST) == f"{root}/e"
    assert files.committed_children(s3.bucket() + "/none", MANIFEST) == {}


def test_plain_paths_and_file_urls_are_local(tmp_path):
    assert fs.of(str(tmp_path)) is fs.of("file://" + str(tmp_path))
    assert fs.of(str(tmp_path)).renames
    path = "file://" + str(tmp_path / "out")
    _publish(path, "one")
    assert sorted(os.listdir(tmp_path)) == ["out"]  # renamed into place, as a plain path is
    assert files.committed(path, MANIFEST) == path
    assert files.read_small(str(tmp_path / "out"), None, "content", "t") == b"one"


def test_a_url_without_its_package_or_protocol_is_refused():
    with pytest.raises(ImportError, match=r"gs://b/x: fsspec has no gs:// filesystem.*gcsfs"):
        fs.of("gs://b/x")
    with pytest.raises(ValueError, match="nosuch://b/x: not a filesystem fsspec knows"):
        fs.of("nosuch://b/x")
