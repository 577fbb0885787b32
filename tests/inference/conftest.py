"""The checkpoints the inference tests read, made once per session: a
trained three-table job dumped at two ranks (float32 rows), and at one rank
with bfloat16 rows."""

import pytest
import torch

from tests.inference import inference_harness as ih


@pytest.fixture(scope="session")
def job(tmp_path_factory):
    """(case, checkpoint path, rows) of the float32 job at two ranks."""
    cs = ih.case()
    path = str(tmp_path_factory.mktemp("inference") / "ckpt")
    return cs, path, ih.checkpoint(cs, path, world=2)


@pytest.fixture(scope="session")
def bf16_job(tmp_path_factory):
    """(case, checkpoint path, rows) of a bfloat16 job at one rank."""
    cs = ih.case("serve_bf16", embedding_dtype=torch.bfloat16)
    path = str(tmp_path_factory.mktemp("inference") / "ckpt_bf16")
    return cs, path, ih.checkpoint(cs, path, world=1)
