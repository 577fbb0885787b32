"""Click logs on disk for the main job (examples/train_dlrm.py --data): the
Criteo-style TSV format, read as batches sharded over the ranks.

The format: one example per line, 40 fields separated by tabs,

    label  I1 .. I13  C1 .. C26

- label: 0 or 1 (a click);
- I1 .. I13: integer dense features (counts), empty when missing; the model
  gets log(1 + max(x, 0)), 0 for a missing one;
- C1 .. C26: categorical ids, hexadecimal (Criteo's own, e.g. ``68fd1e64``;
  ``--id-format hex``, the default) or decimal (``--id-format int``), at most
  64 bits (taken as int64, wrapping), empty when missing (an empty bag).

A file whose name ends in ``.gz`` is read through gzip. ``--data`` names a
file or a folder; a folder's files ending in ``.tsv`` or ``.tsv.gz`` are
read in name order, one stream. ``make_sample_data.py`` writes a sample.

Sharding: the stream is read in order, over and over (an epoch is one pass
over all files). Step ``s`` of a job of ``W`` ranks with ``B`` examples per
rank takes the next ``W * B`` lines, rank ``r`` lines ``r * B .. r * B + B - 1``
of them. Every rank reads the whole stream and parses its own lines only, so
the split does not depend on the number of files, and the position in the
stream (epoch, file, line: ``Cursor``) is the same on every rank: it is all
a checkpoint needs to go on, at any world size or batch size.
"""

import gzip
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

NUM_DENSE = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL
ID_FORMATS = {"hex": 16, "int": 10}
SUFFIXES = (".tsv", ".tsv.gz")

_U64 = 1 << 64
INT64_MIN = -(1 << 63)
# dynamicemb reserves the four smallest int64 values as table markers.
RESERVED_KEYS = 4


def categorical_names() -> list[str]:
    """The categorical features' names, C1 .. C26 as in the format."""
    return [f"c{i + 1}" for i in range(NUM_CATEGORICAL)]


def list_files(path: str) -> list[str]:
    """The files ``path`` names: itself, or a folder's ``SUFFIXES`` files in
    name order.

    Raises:
        FileNotFoundError: ``path`` does not exist or a folder has no such file.
    """
    if os.path.isfile(path):
        return [path]
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: neither a file nor a folder")
    names = sorted(n for n in os.listdir(path) if n.endswith(SUFFIXES))
    files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
    if not files:
        raise FileNotFoundError(f"{path}: the folder holds no {' or '.join(SUFFIXES)} file")
    return files


def _open(path: str):
    """The file's bytes (decoded line by line: ``parse_line`` names a byte
    that is not ASCII by its line and field)."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _field_name(i: int) -> str:
    if i == 0:
        return "label"
    return f"I{i}" if i <= NUM_DENSE else f"C{i - NUM_DENSE}"


def _decode(line: bytes | str, where: str) -> str:
    """A line as text (ASCII, as the format is).

    Raises:
        ValueError: naming ``where``, the field and the byte that is not ASCII.
    """
    if isinstance(line, str):
        return line
    try:
        return line.decode("ascii")
    except UnicodeDecodeError as e:
        field = _field_name(line[: e.start].count(b"\t"))
        raise ValueError(
            f"{where}: {field} holds the byte 0x{line[e.start]:02x}, which is not ASCII"
        ) from None


def to_key(value: int) -> int:
    """An id as the int64 key of its table: 64 bits, wrapped; the reserved
    smallest values moved just above them."""
    value %= _U64
    key = value - _U64 if value >> 63 else value
    return key + RESERVED_KEYS if key < INT64_MIN + RESERVED_KEYS else key


@dataclass
class Record:
    label: int
    dense: list[float]  # NUM_DENSE, already log(1 + max(x, 0))
    ids: list[int | None]  # NUM_CATEGORICAL keys, None: missing


def parse_line(line: str | bytes, base: int, where: str) -> Record:
    """One line of the format (``base`` 16 or 10 for the ids).

    Raises:
        ValueError: naming ``where`` (file and line) and the bad field.
    """
    fields = _decode(line, where).rstrip("\n").rstrip("\r").split("\t")
    if len(fields) != NUM_FIELDS:
        raise ValueError(f"{where}: {len(fields)} tab-separated fields, expected {NUM_FIELDS}")
    label = fields[0]
    if label not in ("0", "1"):
        raise ValueError(f"{where}: label {label!r} is not 0 or 1")
    dense = []
    for i, tok in enumerate(fields[1 : 1 + NUM_DENSE]):
        try:
            x = int(tok) if tok else 0
        except ValueError:
            raise ValueError(f"{where}: I{i + 1} {_shown(tok)} is not an integer") from None
        try:
            dense.append(math.log1p(x) if x > 0 else 0.0)
        except OverflowError:
            raise ValueError(f"{where}: I{i + 1} {_shown(tok)} is too large a count") from None
    ids: list[int | None] = []
    for i, tok in enumerate(fields[1 + NUM_DENSE :]):
        if not tok:
            ids.append(None)
            continue
        try:
            v = int(tok, base)
        except ValueError:
            kind = "hexadecimal" if base == 16 else "decimal"
            raise ValueError(f"{where}: C{i + 1} {_shown(tok)} is not a {kind} id") from None
        if not -(1 << 63) <= v < _U64:
            raise ValueError(f"{where}: C{i + 1} {_shown(tok)} does not fit in 64 bits")
        ids.append(to_key(v))
    return Record(int(label), dense, ids)


def _shown(tok: str, limit: int = 40) -> str:
    """A field as a message shows it (a long one cut, its length said)."""
    if len(tok) <= limit:
        return repr(tok)
    return f"{tok[:limit]!r}... ({len(tok)} characters)"


def format_line(label: int, dense: list[int | None], ids: list[int | None], base: int) -> str:
    """One line of the format: ``dense`` the raw integers, ``ids`` non-negative
    ids (None: a missing field)."""
    d = ["" if x is None else str(x) for x in dense]
    c = ["" if x is None else (f"{x:08x}" if base == 16 else str(x)) for x in ids]
    return "\t".join([str(label), *d, *c]) + "\n"


@dataclass(frozen=True)
class Cursor:
    """A position in the stream: the next line is line ``line`` (0-based) of
    file ``file`` in epoch ``epoch``."""

    epoch: int = 0
    file: int = 0
    line: int = 0

    def to_json(self) -> list[int]:
        return [self.epoch, self.file, self.line]

    @staticmethod
    def from_json(v) -> "Cursor":
        return Cursor(*(int(x) for x in v))


class ClickFiles:
    """The batches of one rank from a stream of TSV files (see the module
    docstring), starting at ``cursor``; ``cursor`` after each batch is where
    the next step starts."""

    def __init__(
        self,
        files: list[str],
        batch_size: int,
        rank: int,
        world_size: int,
        id_format: str = "hex",
        cursor: Cursor | None = None,
    ) -> None:
        if not files:
            raise ValueError("no data files")
        self.files = list(files)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.base = ID_FORMATS[id_format]
        self.cursor = cursor or Cursor()
        if self.cursor.file >= len(self.files):
            raise ValueError(
                f"data position {self.cursor} is past the {len(self.files)} files given"
            )

    def _lines(self) -> Iterator[tuple[str, str, Cursor]]:
        """(line, its file:line name, the cursor after it), from ``cursor``
        on, over and over."""
        c = self.cursor
        empty_epoch = c.file == 0 and c.line == 0  # a whole epoch ahead
        while True:
            path = self.files[c.file]
            n = 0
            try:
                with _open(path) as f:
                    for n, line in enumerate(f, 1):
                        if n <= c.line:
                            continue
                        empty_epoch = False
                        yield line, f"{path}:{n}", Cursor(c.epoch, c.file, n)
            except (EOFError, OSError, zlib.error) as e:
                # A truncated or damaged gzip file, or one that is not gzip.
                raise ValueError(
                    f"{path}: cannot be read after line {n} ({type(e).__name__}: {e})"
                ) from None
            if c.line > n:
                raise ValueError(
                    f"data position {c} is past the end of {path} ({n} lines): the files "
                    "changed since the checkpoint"
                )
            if c.file + 1 < len(self.files):
                c = Cursor(c.epoch, c.file + 1, 0)
                continue
            if empty_epoch:
                raise ValueError(f"the data files hold no line: {', '.join(self.files)}")
            c = Cursor(c.epoch + 1, 0, 0)
            empty_epoch = True

    def __iter__(self):
        """Yields (dense (B, 13) float32, ids: per feature a list of B keys
        or None, labels (B) float32) per step, and advances ``cursor``."""
        lines = self._lines()
        lo = self.rank * self.batch_size
        hi = lo + self.batch_size
        while True:
            records = []
            for i in range(self.world_size * self.batch_size):
                line, where, after = next(lines)
                if lo <= i < hi:
                    records.append(parse_line(line, self.base, where))
            self.cursor = after
            yield to_tensors(records)


def to_tensors(records: list[Record]):
    """(dense, values, lengths, labels) of a batch: the dense features
    (B, 13) float32, the ids feature-major as a KeyedJaggedTensor wants them
    (int64), one length (0 or 1) per feature and example, the labels."""
    b = len(records)
    dense = torch.tensor([r.dense for r in records], dtype=torch.float32).reshape(b, NUM_DENSE)
    labels = torch.tensor([r.label for r in records], dtype=torch.float32)
    values: list[int] = []
    lengths: list[int] = []
    for f in range(NUM_CATEGORICAL):
        for r in records:
            k = r.ids[f]
            lengths.append(0 if k is None else 1)
            if k is not None:
                values.append(k)
    return (
        dense,
        torch.tensor(values, dtype=torch.int64),
        torch.tensor(lengths, dtype=torch.int64),
        labels,
    )
