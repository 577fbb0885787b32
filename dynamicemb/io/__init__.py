"""Generic I/O of the packages that write and read tables' rows (checkpoints,
replication): collectives over a process group, checksummed files written
and read back verified, folders published atomically (local folders by
rename; object stores, fsspec URLs, by a manifest written last: ``fs.py``),
dtype names, chunks.

Nothing here knows a table: ``dynamicemb.checkpoint`` and
``dynamicemb.replication`` build their formats on it. A reader refuses bad
data with the error class its caller names (``error=``; ``DataError`` by
default), so each format reports in its own terms.
"""

from dynamicemb.io.comm import Group
from dynamicemb.io.dtypes import dtype_name, dtype_of, key_dtype_name, key_dtype_of
from dynamicemb.io.files import (
    CHECKSUM_ALGORITHM,
    CHECKSUM_BLOCK_BYTES,
    CHUNK_BYTES,
    IO_THREADS,
    CheckedWriter,
    DataError,
    FileInfo,
    Progress,
    check_name,
    check_sizes,
    chunk_rows,
    committed,
    committed_children,
    crc32_blocks,
    decode_manifest,
    encode_manifest,
    fsync_path,
    host_bytes,
    make_tmp,
    publish,
    read_manifest,
    read_small,
    read_verified,
    run_tasks,
    write_manifest,
    write_small,
)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "CHECKSUM_BLOCK_BYTES",
    "CHUNK_BYTES",
    "IO_THREADS",
    "CheckedWriter",
    "DataError",
    "FileInfo",
    "Group",
    "Progress",
    "check_name",
    "check_sizes",
    "chunk_rows",
    "committed",
    "committed_children",
    "crc32_blocks",
    "decode_manifest",
    "dtype_name",
    "dtype_of",
    "encode_manifest",
    "fsync_path",
    "host_bytes",
    "key_dtype_name",
    "key_dtype_of",
    "make_tmp",
    "publish",
    "read_manifest",
    "read_small",
    "read_verified",
    "run_tasks",
    "write_manifest",
    "write_small",
]
