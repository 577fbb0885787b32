"""Per-table planner constraints that mark a table as a dynamic embedding table."""

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

from torchrec.distributed.planner.types import ParameterConstraints

try:
    from torchrec.distributed.planner.types import hash_sha256_to_int
except ImportError:  # older TorchRec releases

    def hash_sha256_to_int(hashable_list: list[Any]) -> int:
        digest = hashlib.sha256(repr(hashable_list).encode()).digest()
        return int.from_bytes(digest[:8], "big")


from ..dynamicemb_config import DynamicEmbTableOptions

__all__ = ["DynamicEmbParameterConstraints"]


@dataclass
class DynamicEmbParameterConstraints(ParameterConstraints):
    """TorchRec ``ParameterConstraints`` plus the dynamic embedding options.

    The only place a user says that a table is a dynamic embedding table.
    Everything else is TorchRec's ``ParameterConstraints``, used as there.

    Attributes:
        use_dynamicemb (Optional[bool]): keep this table in a DynamicEmb hash
            table. Defaults to False.
        dynamicemb_options (Optional[DynamicEmbTableOptions]): the table's
            dynamic embedding configuration, including its initializer
            arguments (UNIFORM by default). Defaults to a fresh
            ``DynamicEmbTableOptions()`` per instance.
    """

    use_dynamicemb: bool | None = False
    dynamicemb_options: DynamicEmbTableOptions | None = field(
        default_factory=DynamicEmbTableOptions
    )

    def __hash__(self) -> int:
        # The planner hashes constraints (to key its plan cache); a dataclass
        # with eq=True would otherwise drop the hash ParameterConstraints
        # defines. Options are hashed by their repr, i.e. by content.
        return hash_sha256_to_int(
            [
                _base_hash(self),
                self.use_dynamicemb,
                self.dynamicemb_options,
            ]
        )


def _base_hash(constraints: ParameterConstraints) -> int:
    """``ParameterConstraints``' own hash, or (in TorchRec releases where it
    has none) a hash of its fields' reprs."""
    if ParameterConstraints.__hash__ is not None:
        return ParameterConstraints.__hash__(constraints)
    return hash_sha256_to_int(
        [getattr(constraints, f.name) for f in dataclasses.fields(ParameterConstraints)]
    )
