"""The check of a sharded collection's input batch, before its input
distribution, with one verdict for every rank.

A bad batch on one rank must not leave the others inside an all-to-all: the
keys' owner would refuse a reserved key only after the keys were exchanged,
while the rank that sent it goes on into the output all-to-all. So each rank
checks its own batch before any collective of the step and the ranks agree on
the verdict with one small all-reduce: every rank raises for the same step,
with the same message naming the rank whose batch was bad and the bad value,
or none does. A refused step changes nothing (no table, step counter or
collective state).

Each rank's finding is one row of ``FIELDS`` int64 words, ``(code, a, b, c)``
(``Code``; the words' meaning is the code's). The host-side facts (layout,
dtypes, devices, a batch without samples) are known without a device read;
the value checks (negative lengths, lengths that do not add up to the values,
reserved keys and bad weights of the dynamic tables' features, ids of the
static tables' features outside their rows) are one op on the batch's device
(``check_batch``, cc/routing/batch_check.h), which also sums the lengths per
feature. Beside its finding, each rank puts the batch's ``SIGNATURE`` words
in its row: the dtypes of its values, lengths and weights (-1: none) and its
stride. Batches that each pass but differ in these between ranks would pair
mismatched collectives (TorchRec's all-to-alls size their buffers by them), so
they are refused too: every rank must send the same dtypes and weights, and,
where the outputs are pooled (an EmbeddingBagCollection's reduce-scatter),
the same batch size. The rows of all ranks (each rank fills its own, the
others are zeros) are summed by the all-reduce and read on the host together
with the batch's lengths per feature, which the input distribution reads
anyway (TorchRec's ``KeyedJaggedTensor.split``): the batch is handed on with
those lengths cached, so the check adds no host read to the step.
"""

import enum
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ..embedding.inputs import COUNTERS, POOLING, WEIGHT_RULE_CODES, WEIGHT_RULES, Finding
from ..table import ops, reserved_key_error

__all__ = ["COUNTERS", "POOLING", "BatchCheck", "Code"]

FIELDS = 4
# The batch's words each rank compares with the others': values, lengths and
# weights dtypes (their index in _DTYPES; weights -1: none) and the stride.
SIGNATURE = ("values", "lengths", "weights", "stride")

# dtypes and device types as they travel in a row (their index; -1: another).
_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)
_DEVICE_TYPES = ("cpu", "cuda", "meta")
_TENSORS = ("values", "lengths", "weights", "offsets")
_INT_DTYPES = (torch.int32, torch.int64)


class Code(enum.IntEnum):
    """What a rank found wrong with its batch (the first of these)."""

    OK = 0
    VARIABLE_STRIDE = 1
    NOT_A_TENSOR = 2  # a: tensor
    DTYPE = 3  # a: tensor, b: dtype
    DIM = 4  # a: tensor, b: dim
    DEVICE = 5  # a: tensor, b: device type, c: device index (-1: none)
    LENGTHS_NUMEL = 6  # a: lengths, b: features, c: stride
    WEIGHTS_NUMEL = 7  # a: weights, b: values
    # check_batch's findings (dynamicemb.embedding.inputs.Finding).
    OFFSETS_START = int(Finding.OFFSETS_START)
    NEGATIVE_LENGTH = int(Finding.NEGATIVE_LENGTH)
    LENGTHS_SUM = int(Finding.LENGTHS_SUM)
    RESERVED_KEY = int(Finding.RESERVED_KEY)
    BAD_WEIGHT = int(Finding.BAD_WEIGHT)
    MISSING_FEATURE = 13  # a: the feature's index among the collection's
    KEYS_CHANGED = 14  # the KJT's keys are not the first batch's
    BAD_ID = 15  # a: position in the values, b: id, c: feature (a static table's)
    NO_SAMPLES = 16  # the batch's stride is 0


def _index(seq: Sequence, item) -> int:
    return seq.index(item) if item in seq else -1


def _dtype_name(i: int) -> str:
    return str(_DTYPES[i]) if 0 <= i < len(_DTYPES) else "another dtype"


def _device_name(t: int, i: int) -> str:
    name = _DEVICE_TYPES[t] if 0 <= t < len(_DEVICE_TYPES) else "another device type"
    return name if i < 0 else f"{name}:{i}"


def _to_device(words: list[int], device: torch.device) -> torch.Tensor:
    """int64 ``words`` on ``device``, copied without waiting for the device
    (from pinned memory to a GPU)."""
    t = torch.tensor(words, dtype=torch.int64)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _on_device(t: torch.Tensor, device: torch.device | None) -> bool:
    if device is None:
        return True
    if t.device.type != device.type:
        return False
    return device.index is None or t.device.index == device.index


class BatchCheck:
    """The batch check of one sharded collection.

    Args:
        dynamic_features (Sequence[str]): the features of its dynamic tables
            (the ones whose keys must not be reserved).
        collection_features (Sequence[str]): every feature of the
            collection: the first batch must have them all, and every later
            batch the first one's keys in its order (TorchRec's sharded
            collection reorders every batch as it did the first).
        weights (Optional[str]): what the dynamic features' KJT weights are
            to their tables: ``COUNTERS`` (an EmbeddingCollection's: finite
            whole numbers >= 0), ``POOLING`` (a weighted
            EmbeddingBagCollection's: finite) or None (not read).
        device (Optional[torch.device]): the collection's device; the batch
            must be on it.
        pg (Optional[dist.ProcessGroup]): the group whose ranks must agree
            (None, or a group of one: no collective).
        static_rows (Optional[Mapping[str, int]]): the rows of each static
            (TorchRec) table's feature: its ids must lie in [0, rows) (TorchRec's
            kernels would read row 0 for any other id).
        pooled (bool): the outputs are pooled (an EmbeddingBagCollection's):
            every rank's batch must have the same stride.
    """

    def __init__(
        self,
        dynamic_features: Sequence[str],
        device: torch.device | None,
        pg: dist.ProcessGroup | None,
        collection_features: Sequence[str] = (),
        weights: str | None = None,
        static_rows: Mapping[str, int] | None = None,
        pooled: bool = False,
    ) -> None:
        if weights not in (None, *WEIGHT_RULES):
            raise ValueError(f"weights must be None or one of {sorted(WEIGHT_RULES)}")
        self._weights = weights
        self._dynamic = frozenset(dynamic_features)
        self._device = device
        self._pg = pg
        self._world_size = 1 if pg is None else dist.get_world_size(pg)
        self._rank = 0 if pg is None else dist.get_rank(pg)
        self._masks: dict[tuple[str, ...], torch.Tensor | None] = {}
        self._static_rows = dict(static_rows or {})
        self._rows: dict[tuple[str, ...], torch.Tensor | None] = {}
        self._pooled = pooled
        self._features = list(collection_features)
        self._keys: tuple[str, ...] | None = None  # the first accepted batch's

    def __call__(self, features: KeyedJaggedTensor) -> None:
        """Checks this rank's batch and agrees with the other ranks.

        Raises:
            ValueError: some rank's batch is bad, or the ranks' batches differ
                in their dtypes, weights or (pooled) batch size (the same error
                on every rank, naming the rank(s), the case and the bad value).
            NotImplementedError: some rank's batch has a variable stride per
                feature.
        """
        row_device = self._device if self._device is not None else torch.device("cpu")
        host = self._host_row(features)
        signature = [0] * len(SIGNATURE)
        if host is not None:
            local = torch.tensor(host, dtype=torch.int64, device=row_device)
        else:
            local = self._device_row(features).to(row_device)
            signature = self._signature(features)
        width = FIELDS + len(SIGNATURE)
        words = local
        if self._world_size > 1:
            rows = torch.zeros(self._world_size, width, dtype=torch.int64, device=row_device)
            rows[self._rank, :FIELDS] = local[:FIELDS]
            rows[self._rank, FIELDS:] = _to_device(signature, row_device)
            dist.all_reduce(rows, group=self._pg)
            words = torch.cat([rows.reshape(-1), local[FIELDS:]])
        else:
            width = FIELDS
        read = words.tolist()  # the one host read
        found = [read[r * width : (r + 1) * width] for r in range(self._world_size)]
        bad = [r for r, f in enumerate(found) if f[0] != Code.OK]
        if bad:
            raise self._error(features, bad, found)
        if self._world_size > 1:
            differ = self._differ([f[FIELDS:] for f in found])
            if differ is not None:
                raise ValueError(f"{differ}; the step is refused on every rank")
        if self._keys is None:
            self._keys = tuple(features.keys())
        if features._length_per_key is None:
            # What KeyedJaggedTensor.length_per_key() caches when it reads them.
            features._length_per_key = read[len(found) * width :]

    # ------------------------------------------------------------ the row --

    def _host_row(self, features: KeyedJaggedTensor) -> list[int] | None:
        """The row of what is known without reading the device, or None."""
        if features.variable_stride_per_key():
            return [Code.VARIABLE_STRIDE, 0, 0, 0]
        keys = tuple(features.keys())
        if self._keys is None:
            for i, name in enumerate(self._features):
                if name not in keys:
                    return [Code.MISSING_FEATURE, i, 0, 0]
        elif keys != self._keys:
            return [Code.KEYS_CHANGED, 0, 0, 0]
        tensors = {
            "values": features.values(),
            "lengths": features.lengths(),
            "weights": features.weights_or_none(),
            "offsets": features.offsets_or_none(),
        }
        for name, t in tensors.items():
            if t is None and name in ("weights", "offsets"):
                continue
            w = _TENSORS.index(name)
            if not isinstance(t, torch.Tensor):
                return [Code.NOT_A_TENSOR, w, 0, 0]
            if not _on_device(t, self._device):
                return [
                    Code.DEVICE,
                    w,
                    _index(_DEVICE_TYPES, t.device.type),
                    -1 if t.device.index is None else t.device.index,
                ]
            if t.dim() != 1:
                return [Code.DIM, w, t.dim(), 0]
            ok = t.is_floating_point() if name == "weights" else t.dtype in _INT_DTYPES
            if not ok:
                return [Code.DTYPE, w, _index(_DTYPES, t.dtype), 0]
        values, lengths, weights = tensors["values"], tensors["lengths"], tensors["weights"]
        num_features = len(features.keys())
        stride = features.stride() if num_features else 0
        if lengths.numel() != num_features * stride:
            return [Code.LENGTHS_NUMEL, lengths.numel(), num_features, stride]
        if weights is not None and weights.numel() != values.numel():
            return [Code.WEIGHTS_NUMEL, weights.numel(), values.numel(), 0]
        if num_features and stride == 0:
            return [Code.NO_SAMPLES, 0, 0, 0]
        return None

    def _signature(self, features: KeyedJaggedTensor) -> list[int]:
        """The ``SIGNATURE`` words of a batch the host checks passed."""
        weights = features.weights_or_none()
        return [
            _index(_DTYPES, features.values().dtype),
            _index(_DTYPES, features.lengths().dtype),
            -1 if weights is None else _index(_DTYPES, weights.dtype),
            features.stride() if features.keys() else 0,
        ]

    def _differ(self, signatures: list[list[int]]) -> str | None:
        """What differs between the ranks' batches (their ``SIGNATURE``
        words, by rank), or None."""
        for i, name in enumerate(SIGNATURE):
            seen = [s[i] for s in signatures]
            if len(set(seen)) == 1 or (name == "stride" and not self._pooled):
                continue
            if name == "stride":
                what = "batch sizes (strides)"
                each = [str(v) for v in seen]
                rule = "pooled outputs need one batch size on every rank"
            elif name == "weights":
                what = "weights"
                each = ["none" if v < 0 else _dtype_name(v) for v in seen]
                rule = "every rank's batch must carry weights of one dtype, or none"
            else:
                what = f"{name} dtypes"
                each = [_dtype_name(v) for v in seen]
                rule = f"every rank's {name} must have one dtype"
            ranks = ", ".join(f"rank {r}'s {v}" for r, v in enumerate(each))
            return f"the ranks' batches differ in their {what} ({ranks}): {rule}"
        return None

    def _device_row(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """The value checks' row and the lengths per feature, ``FIELDS +
        num_features`` int64 words on the batch's device, from one op
        (``check_batch``, cc/routing/batch_check.h): nothing read."""
        num_features = len(features.keys())
        offsets = features.offsets_or_none()
        weights = features.weights_or_none()
        return ops().check_batch(
            features.values().contiguous(),
            features.lengths().contiguous(),
            None if weights is None else weights.contiguous(),
            offsets if offsets is not None and offsets.numel() else None,
            self._dynamic_mask(features.keys(), features.values().device),
            num_features,
            features.stride() if num_features else 0,
            WEIGHT_RULE_CODES[self._weights],
            self._feature_rows(features.keys(), features.values().device),
        )

    def _dynamic_mask(self, keys: list[str], device: torch.device) -> torch.Tensor | None:
        """Which features' keys and weights are checked: None (all) or a
        (num_features) bool tensor, made once per list of keys."""
        names = tuple(keys)
        if names not in self._masks:
            dynamic = [name in self._dynamic for name in names]
            mask = None
            if not all(dynamic):
                mask = torch.tensor(dynamic, dtype=torch.bool, device=device)
            self._masks[names] = mask
        return self._masks[names]

    def _feature_rows(self, keys: list[str], device: torch.device) -> torch.Tensor | None:
        """The rows bounding each feature's ids (the static tables'; 0: not
        bounded), a (num_features) int64 tensor made once per list of keys,
        or None when no feature is bounded."""
        names = tuple(keys)
        if names not in self._rows:
            rows = [self._static_rows.get(name, 0) for name in names]
            bounded = any(rows)
            self._rows[names] = torch.tensor(rows, device=device) if bounded else None
        return self._rows[names]

    # ---------------------------------------------------------- the error --

    def _error(self, features: KeyedJaggedTensor, bad: list[int], found: list[list[int]]):
        r = bad[0]
        code, a, b, c = found[r][:FIELDS]
        what = f"rank {r}'s batch"
        if code == Code.VARIABLE_STRIDE:
            return NotImplementedError(
                f"{what} has a variable batch size per feature: dynamic embedding tables do not "
                "support it (refused on every rank)"
            )
        keys = list(features.keys())
        if code == Code.RESERVED_KEY:
            feature = keys[c] if 0 <= c < len(keys) else str(c)
            msg = str(reserved_key_error(f"{what}'s values (feature {feature!r})", b, a))
        elif code == Code.BAD_ID:
            feature = keys[c] if 0 <= c < len(keys) else str(c)
            rows = self._static_rows.get(feature)
            msg = (
                f"{what}: id {b} at index {a} of feature {feature!r} is not a row of its "
                f"table, whose ids lie in [0, {rows})"
            )
        elif code == Code.NO_SAMPLES:
            msg = f"{what} has no samples (stride 0): every rank's batch must have some"
        elif code == Code.BAD_WEIGHT:
            feature = keys[c] if 0 <= c < len(keys) else str(c)
            weight = torch.tensor([b], dtype=torch.int64).view(torch.float64).item()
            msg = (
                f"{what}: the weights of feature {feature!r} are its table's {self._weights} and "
                f"must be {WEIGHT_RULES[self._weights]}, got {weight} at index {a}"
            )
        elif code == Code.MISSING_FEATURE:
            name = self._features[a] if 0 <= a < len(self._features) else str(a)
            msg = f"{what}: the KJT has no feature {name!r} of the sharded collection"
        elif code == Code.KEYS_CHANGED:
            msg = (
                f"{what}: the KJT's keys are not the first batch's {list(self._keys or ())} in "
                "that order (the sharded collection reorders every batch as it did the first)"
            )
        elif code == Code.NOT_A_TENSOR:
            msg = f"{what}: the KeyedJaggedTensor's {_TENSORS[a]} are not a tensor"
        elif code == Code.DTYPE:
            want = "a floating dtype" if _TENSORS[a] == "weights" else "int32 or int64"
            msg = f"{what}: {_TENSORS[a]} must be {want}, got {_dtype_name(b)}"
        elif code == Code.DIM:
            msg = f"{what}: {_TENSORS[a]} must be 1-D, got {b} dimensions"
        elif code == Code.DEVICE:
            msg = (
                f"{what}: {_TENSORS[a]} are on {_device_name(b, c)}, the sharded collection on "
                f"{self._device}"
            )
        elif code == Code.LENGTHS_NUMEL:
            msg = f"{what}: lengths has {a} entries, not features ({b}) * stride ({c}) = {b * c}"
        elif code == Code.WEIGHTS_NUMEL:
            msg = f"{what}: weights has {a} entries for {b} values"
        elif code == Code.OFFSETS_START:
            msg = f"{what}: offsets must start at 0, got {a}"
        elif code == Code.NEGATIVE_LENGTH:
            msg = f"{what}: lengths must not be negative, got {b} at index {a}"
        elif code == Code.LENGTHS_SUM:
            msg = f"{what}: the lengths add up to {a}, but there are {b} values"
        else:
            msg = f"{what}: unknown check code {code}"
        others = f" (also the batches of ranks {bad[1:]})" if len(bad) > 1 else ""
        return ValueError(f"{msg}{others}; the step is refused on every rank")
