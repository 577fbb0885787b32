"""Python copies of facts the C++ code defines, proven equal to the built
extension's (``dynamicemb._C.constants()``).

The configuration modules keep these copies so that they import without the
extension; everything else reads the C++ values directly.
"""

import pytest
import torch

from dynamicemb import BUCKET_ALIGNMENT, DynamicEmbInitializerMode, DynamicEmbOptimType
from dynamicemb.dynamicemb_config import DIST_TYPES, optimizer_state_dim, saved_state_dim
from dynamicemb.embedding import RowOptimizer
from dynamicemb.table import constants, extension

split_configs = pytest.importorskip("fbgemm_gpu.split_embedding_configs")


def test_bucket_alignment_is_the_tables():
    assert BUCKET_ALIGNMENT == constants()["BUCKET_ALIGNMENT"]


def test_dist_types_are_the_routing_rules_in_their_order():
    from dynamicemb.shard import DIST_TYPE_CODES

    native = constants()["DistType"]
    assert DIST_TYPE_CODES == native
    assert DIST_TYPES == tuple(sorted(native, key=native.get))


def test_every_initializer_mode_has_a_kernel_mode_of_its_name():
    native = constants()["InitMode"]
    assert {m.name for m in DynamicEmbInitializerMode} == set(native)


def test_weight_decay_modes_are_fbgemms():
    # fused_params carry FBGEMM's WeightDecayMode; the kernels read its value.
    training = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
    for name, value in constants()["WeightDecayMode"].items():
        assert training.WeightDecayMode[name].value == value


OPTIMIZERS = [
    split_configs.EmbOptimType.EXACT_SGD,
    split_configs.EmbOptimType.ADAM,
    split_configs.EmbOptimType.EXACT_ADAGRAD,
    split_configs.EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    DynamicEmbOptimType.FTRL,
    DynamicEmbOptimType.ROWWISE_RMSPROP_AR,
]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_optimizer_state_width_is_the_kernels(optimizer):
    native_type = RowOptimizer(optimizer).packed(1)[constants()["OptimField"]["TYPE"]]
    for dim in (1, 2, 31, 32, 33, 128, 129):
        want = extension().state_dim(int(native_type), dim)
        assert optimizer_state_dim(optimizer, dim, torch.float32) == want
        # What checkpoints and deltas carry of it: what the update uses.
        used = extension().state_used(int(native_type), dim)
        assert saved_state_dim(optimizer.name, want) == used


def test_every_native_optimizer_is_one_an_optimizer_type_runs():
    from dynamicemb.dynamicemb_config import native_optimizer

    assert {native_optimizer(o) for o in OPTIMIZERS} == set(constants()["OptimType"])


def test_optimizer_fields_are_row_optimizer_fields():
    fields = {f.lower() for f in constants()["OptimField"]} - {"type", "step"}
    assert fields == set(RowOptimizer.__dataclass_fields__) - {
        "optimizer",
        "initial_accumulator_value",
    }
