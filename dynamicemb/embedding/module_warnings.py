"""What the embedding module says once instead of failing later or silently:
a default optimizer that needs FBGEMM, a state dict without the tables'
rows, rows all in host memory for want of a device budget."""

from collections.abc import Sequence

import torch

from dynamicemb._warnings import warn_once
from dynamicemb.dynamicemb_config import DynamicEmbTableOptions


def default_optimizer():
    """FBGEMM's EmbOptimType.EXACT_SGD, the default ``optimizer``; an
    ImportError that says what to install when FBGEMM cannot be imported."""
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
    except (ImportError, OSError) as e:
        raise ImportError(
            "BatchedDynamicEmbeddingTablesV2: the default optimizer is FBGEMM's "
            f"EmbOptimType.EXACT_SGD, and fbgemm_gpu does not import ({e}). Install "
            "fbgemm-gpu-cpu with a CPU torch or fbgemm-gpu with a CUDA torch (the extras "
            "dynamicemb[fbgemm-cpu] / dynamicemb[fbgemm-cuda]), or pass an optimizer that "
            "needs no FBGEMM (optimizer=DynamicEmbOptimType.FTRL)."
        ) from e
    return EmbOptimType.EXACT_SGD


def state_dict_hook(module, state_dict, prefix, local_metadata) -> None:
    """The module's state dict hook: ``warn_state_dict_without_rows``."""
    warn_state_dict_without_rows()


def warn_state_dict_without_rows() -> None:
    """Warns, once per process, that a state dict lacks the dynamic tables'
    rows: a bare module's (this module's state dict hook), or a sharded
    collection's where dynamicemb.checkpoint cannot be imported."""
    warn_once(
        "state_dict_without_rows",
        "state_dict() does not hold the rows of these dynamic embedding tables: they live in "
        "hash tables, and only a model sharded with the dynamicemb sharders puts them into "
        "its state_dict (through dynamicemb.checkpoint, which must be importable: Bazel "
        "target //dynamicemb/checkpoint). Save and load them with dynamicemb.DynamicEmbDump / "
        "DynamicEmbLoad (docs/checkpoint.md). Shown once.",
    )


def warn_if_host_only(options: Sequence[DynamicEmbTableOptions], device: torch.device) -> None:
    """On a GPU, a table of one hybrid table whose device budget is zero
    keeps every row in host memory: allowed, but worth saying once."""
    if device.type != "cuda" or options[0].caching or options[0].external_storage is not None:
        return
    host_only = [t for t, o in enumerate(options) if o.local_hbm_for_values == 0]
    if host_only:
        warn_once(
            "host_only_rows",
            f"dynamic tables {host_only} of a module on {device} keep all their rows in host "
            "memory: their local_hbm_for_values is 0 (the sharding planner sets it to "
            "ceil(global_hbm_for_values / world_size), and global_hbm_for_values defaults "
            "to 0). Give DynamicEmbTableOptions.global_hbm_for_values a device budget, e.g. "
            "get_table_value_bytes(...) for all rows on the device (docs/storage.md). "
            "Shown once.",
            stacklevel=3,
        )
