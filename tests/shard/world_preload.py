"""What the forkserver of ``shard_harness.run_world`` imports once, before it
forks the ranks of every CPU world: torch, TorchRec's sharding and the
dynamicemb packages the ranks use. A package that this test target does not
depend on is skipped; its ranks import what they use themselves either way.
"""

import importlib

MODULES = (
    "torch.distributed",
    "fbgemm_gpu",
    "torchrec",
    "torchrec.distributed.model_parallel",
    "torchrec.distributed.planner",
    "dynamicemb",
    "dynamicemb.shard",
    "dynamicemb.planner",
    "dynamicemb.checkpoint",
    "dynamicemb.replication",
    "dynamicemb.incremental_dump",
    "dynamicemb.storage",
    "dynamicemb.admission",
)

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass
