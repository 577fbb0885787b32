"""Per-table planner constraints that mark a table as a dynamic embedding table."""

from dataclasses import dataclass, field
from typing import Optional

from torchrec.distributed.planner.types import ParameterConstraints, hash_sha256_to_int

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

    use_dynamicemb: Optional[bool] = False
    dynamicemb_options: Optional[DynamicEmbTableOptions] = field(
        default_factory=DynamicEmbTableOptions
    )

    def __hash__(self) -> int:
        # The planner hashes constraints (to key its plan cache); a dataclass
        # with eq=True would otherwise drop the hash ParameterConstraints
        # defines. Options are hashed by their repr, i.e. by content.
        return hash_sha256_to_int(
            [
                ParameterConstraints.__hash__(self),
                self.use_dynamicemb,
                self.dynamicemb_options,
            ]
        )
