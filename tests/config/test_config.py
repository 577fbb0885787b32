"""Tests of the public configuration layer against the API reference's contract.

Expected numbers are computed here from the spec's rules, not by calling the
code under test.
"""

import ast
import dataclasses
import enum
import importlib
import inspect
import subprocess
import sys
import types
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dynamicemb
from dynamicemb import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbOptimType,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
    ReplayContent,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynamicemb.dynamicemb_config import (
    DEFAULT_INDEX_TYPE,
    _sharded_table_bucket_layout,
    align_to_table_size,
    complete_initializer_args,
    optimizer_state_dim,
)
from dynamicemb.types import AdmissionStrategy, MemoryType, Storage

TS = DynamicEmbScoreStrategy.TIMESTAMP
LFU = DynamicEmbScoreStrategy.LFU


def emb_config(num_embeddings=1000, embedding_dim=16, data_type=torch.float32):
    """A stand-in for a TorchRec embedding config (the fields the rules read)."""
    return types.SimpleNamespace(
        num_embeddings=num_embeddings, embedding_dim=embedding_dim, data_type=data_type
    )


def ceil_div(a, b):
    return (a + b - 1) // b


# ---------------------------------------------------------------- enums


def test_check_mode_members_and_values():
    assert issubclass(DynamicEmbCheckMode, enum.IntEnum)
    assert {m.name: m.value for m in DynamicEmbCheckMode} == {
        "ERROR": 0,
        "WARNING": 1,
        "IGNORE": 2,
    }


def test_initializer_mode_members_and_string_values():
    assert not issubclass(DynamicEmbInitializerMode, int)
    assert {m.name: m.value for m in DynamicEmbInitializerMode} == {
        "NORMAL": "normal",
        "TRUNCATED_NORMAL": "truncated_normal",
        "UNIFORM": "uniform",
        "CONSTANT": "constant",
        "DEBUG": "debug",
    }


def test_score_strategy_members_and_values():
    assert issubclass(DynamicEmbScoreStrategy, enum.IntEnum)
    assert {m.name: m.value for m in DynamicEmbScoreStrategy} == {
        "TIMESTAMP": 0,
        "STEP": 1,
        "CUSTOMIZED": 2,
        "LFU": 3,
        "NO_EVICTION": 4,
    }


def test_pooling_mode_values_behave_as_plain_ints():
    assert {m.name: m.value for m in DynamicEmbPoolingMode} == {
        "SUM": 0,
        "MEAN": 1,
        "NONE": 2,
    }
    assert DynamicEmbPoolingMode.SUM == 0
    assert {0: "sum"}[DynamicEmbPoolingMode.SUM] == "sum"


def test_evict_strategy_members_and_values():
    assert issubclass(DynamicEmbEvictStrategy, enum.IntEnum)
    assert {m.name: m.value for m in DynamicEmbEvictStrategy} == {
        "LRU": 0,
        "LFU": 1,
        "EPOCH_LRU": 2,
        "EPOCH_LFU": 3,
        "CUSTOMIZED": 4,
    }


def test_evicted_item_mode_has_discard_and_retain_key():
    assert [m.name for m in EvictedItemMode] == ["DISCARD", "RETAIN_KEY"]


def test_memory_type_has_device_and_host():
    assert {m.name for m in MemoryType} >= {"DEVICE", "HOST"}


def test_optim_type_ftrl_is_a_plain_enum_value():
    # The spec's FTRL, then the optimizers added since, with FBGEMM's values.
    assert [m.name for m in DynamicEmbOptimType] == ["FTRL", "ROWWISE_RMSPROP_AR"]
    assert DynamicEmbOptimType.ROWWISE_RMSPROP_AR.value == "row_wise_rmsprop_ar"
    assert DynamicEmbOptimType.FTRL.value == "ftrl"
    assert DynamicEmbOptimType("ftrl") is DynamicEmbOptimType.FTRL
    assert DynamicEmbOptimType.FTRL != "ftrl"


def test_optim_type_never_equals_any_emb_optim_type():
    split_configs = pytest.importorskip("fbgemm_gpu.split_embedding_configs")
    for member in split_configs.EmbOptimType:
        for ours in DynamicEmbOptimType:
            assert ours != member
            assert member != ours


def test_replay_content_flags_compose():
    assert issubclass(ReplayContent, enum.Flag)
    assert ReplayContent.EMBEDDING_ONLY.value == 0
    assert ReplayContent.ALL == ReplayContent.OPTIMIZER_STATE | ReplayContent.SCORE
    assert ReplayContent.OPTIMIZER_STATE & ReplayContent.SCORE == ReplayContent.EMBEDDING_ONLY
    assert ReplayContent.SCORE in ReplayContent.ALL
    assert ReplayContent.ALL & ~ReplayContent.SCORE == ReplayContent.OPTIMIZER_STATE
    assert not ReplayContent.EMBEDDING_ONLY


def test_enums_are_unique():
    for enum_type in (
        DynamicEmbCheckMode,
        DynamicEmbInitializerMode,
        DynamicEmbScoreStrategy,
        DynamicEmbPoolingMode,
        DynamicEmbEvictStrategy,
        EvictedItemMode,
        DynamicEmbOptimType,
        ReplayContent,
        MemoryType,
    ):
        values = [member.value for member in enum_type.__members__.values()]
        assert len(set(values)) == len(values), enum_type


# ---------------------------------------------------------------- constants, exports


def test_constants_match_spec():
    assert BUCKET_ALIGNMENT == 16
    assert MAX_BUCKET_CAPACITY == 2**63 - 1
    assert DEFAULT_INDEX_TYPE is torch.int64


def test_top_level_reexports_the_spec_names():
    for name in (
        "DynamicEmbCheckMode",
        "DynamicEmbInitializerMode",
        "DynamicEmbInitializerArgs",
        "DynamicEmbScoreStrategy",
        "DynamicEmbPoolingMode",
        "DynamicEmbTableOptions",
        "DynamicEmbEvictStrategy",
        "DynamicEmbOptimType",
        "EvictedItemMode",
        "ReplayContent",
        "BUCKET_ALIGNMENT",
        "MAX_BUCKET_CAPACITY",
        "get_sharded_table_capacity",
        "get_table_value_bytes",
    ):
        assert hasattr(dynamicemb, name), name
        assert name in dynamicemb.__all__
    assert not hasattr(dynamicemb, "complete_initializer_args")


def test_config_module_exports_the_same_objects_as_the_package():
    import dynamicemb.dynamicemb_config as config

    for name in set(dynamicemb.__all__) & set(config.__all__):
        assert getattr(config, name) is getattr(dynamicemb, name)


def _run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def test_package_imports_without_torchrec_fbgemm_or_extension():
    # A None entry in sys.modules makes that import fail.
    result = _run_python(
        "import sys\n"
        "sys.modules['torchrec'] = None\n"
        "sys.modules['fbgemm_gpu'] = None\n"
        "sys.modules['dynamicemb._C'] = None\n"
        "import dynamicemb, dynamicemb.types, dynamicemb.dynamicemb_config\n"
        "import dynamicemb.incremental_dump\n"
        "o = dynamicemb.DynamicEmbTableOptions()\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("module", ["dynamicemb.types", "dynamicemb._enums"])
def test_leaf_modules_import_nothing_from_the_package(module):
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("dynamicemb")
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("dynamicemb") for a in node.names)


# ---------------------------------------------------------------- initializer args


def test_initializer_args_defaults():
    args = DynamicEmbInitializerArgs()
    assert args.mode is DynamicEmbInitializerMode.UNIFORM
    assert (args.mean, args.std_dev, args.lower, args.upper, args.value) == (
        0.0,
        1.0,
        None,
        None,
        0.0,
    )
    assert [f.name for f in dataclasses.fields(DynamicEmbInitializerArgs)] == [
        "mode",
        "mean",
        "std_dev",
        "lower",
        "upper",
        "value",
    ]


def test_initializer_args_mode_accepts_string_value():
    assert DynamicEmbInitializerArgs(mode="normal").mode is DynamicEmbInitializerMode.NORMAL


def test_initializer_args_rejects_unknown_mode_naming_it():
    with pytest.raises(ValueError, match="gaussian"):
        DynamicEmbInitializerArgs(mode="gaussian")


def test_initializer_args_rejects_lower_above_upper():
    with pytest.raises(ValueError, match=r"lower \(2\.0\).*upper \(1\.0\)"):
        DynamicEmbInitializerArgs(lower=2.0, upper=1.0)


# ---------------------------------------------------------------- table options: defaults

# (name, default) in the order of the spec's listing.
SPEC_FIELDS = [
    ("embedding_dtype", None),
    ("dim", None),
    ("max_capacity", None),
    ("evict_strategy", DynamicEmbEvictStrategy.LRU),
    ("local_hbm_for_values", 0),
    ("device_id", None),
    ("training", True),
    ("initializer_args", DynamicEmbInitializerArgs()),
    (
        "eval_initializer_args",
        DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.0),
    ),
    ("caching", False),
    ("init_capacity", None),
    ("max_load_factor", 0.5),
    ("score_strategy", DynamicEmbScoreStrategy.TIMESTAMP),
    ("bucket_capacity", 128),
    ("safe_check_mode", DynamicEmbCheckMode.IGNORE),
    ("global_hbm_for_values", 0),
    ("external_storage", None),
    ("index_type", None),
    ("admit_strategy", None),
    ("admission_counter", None),
    ("evicted_item_mode", EvictedItemMode.DISCARD),
]


def test_table_options_fields_keep_spec_order_and_defaults():
    options = DynamicEmbTableOptions()
    names = [f.name for f in dataclasses.fields(DynamicEmbTableOptions)]
    assert names[: len(SPEC_FIELDS)] == [name for name, _ in SPEC_FIELDS]
    for name, default in SPEC_FIELDS:
        assert getattr(options, name) == default, name
    assert options.score_function is None
    assert options.dist_type == "roundrobin"


def test_table_options_default_initializers_are_fresh_per_instance():
    a, b = DynamicEmbTableOptions(), DynamicEmbTableOptions()
    assert a.initializer_args is not b.initializer_args
    assert a.eval_initializer_args is not b.eval_initializer_args
    assert a.eval_initializer_args.mode is DynamicEmbInitializerMode.CONSTANT
    assert a.eval_initializer_args.value == 0.0


def test_table_options_default_score_words_is_one():
    options = DynamicEmbTableOptions()
    assert options.num_scores() == 1
    assert options.score_strategies() == (DynamicEmbScoreStrategy.TIMESTAMP,)


# ---------------------------------------------------------------- table options: validation


@pytest.mark.parametrize("strategy", list(DynamicEmbScoreStrategy))
def test_one_element_tuple_is_normalized_to_the_single_strategy(strategy):
    assert DynamicEmbTableOptions(score_strategy=(strategy,)).score_strategy is strategy
    assert DynamicEmbTableOptions(score_strategy=[strategy]).score_strategy is strategy


@pytest.mark.parametrize("order", [(TS, LFU), (LFU, TS)])
def test_compound_strategy_keeps_its_order_and_two_score_words(order):
    options = DynamicEmbTableOptions(score_strategy=order)
    assert options.score_strategy == order
    assert options.score_strategies() == order
    assert options.num_scores() == 2


@pytest.mark.parametrize(
    "bad",
    [
        (TS, DynamicEmbScoreStrategy.STEP),
        (LFU, LFU),
        (TS, LFU, DynamicEmbScoreStrategy.STEP),
        (DynamicEmbScoreStrategy.NO_EVICTION, LFU),
        (),
    ],
)
def test_unsupported_compound_strategy_is_rejected_naming_it(bad):
    with pytest.raises(ValueError, match="score_strategy") as info:
        DynamicEmbTableOptions(score_strategy=bad)
    assert repr(bad) in str(info.value)


def test_unknown_score_strategy_value_is_rejected_naming_it():
    with pytest.raises(ValueError, match="17"):
        DynamicEmbTableOptions(score_strategy=17)


def test_int_score_strategy_is_converted_to_the_enum():
    assert DynamicEmbTableOptions(score_strategy=3).score_strategy is LFU


def _score_function(scores, cur_timestamp):
    return scores[1]


@pytest.mark.parametrize("order", [(TS, LFU), (LFU, TS)])
def test_score_function_is_accepted_with_the_compound_strategy(order):
    options = DynamicEmbTableOptions(score_strategy=order, score_function=_score_function)
    assert options.score_function is _score_function


@pytest.mark.parametrize("strategy", list(DynamicEmbScoreStrategy) + [(LFU,), (TS,)])
def test_score_function_with_a_single_strategy_is_rejected(strategy):
    with pytest.raises(ValueError, match="score_function") as info:
        DynamicEmbTableOptions(score_strategy=strategy, score_function=_score_function)
    assert "score_strategy=" in str(info.value)


def test_score_function_must_be_callable():
    with pytest.raises(TypeError, match="42"):
        DynamicEmbTableOptions(score_strategy=(TS, LFU), score_function=42)


def test_admission_counter_warns_deprecation():
    with pytest.warns(DeprecationWarning, match="admission_counter"):
        DynamicEmbTableOptions(admission_counter=object())


def test_options_without_admission_counter_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DynamicEmbTableOptions()


@pytest.mark.parametrize("width", [16, 32, 128, 1024, 4096, MAX_BUCKET_CAPACITY])
def test_bucket_capacity_multiple_of_16_or_sentinel_is_accepted(width):
    assert DynamicEmbTableOptions(bucket_capacity=width).bucket_capacity == width


@pytest.mark.parametrize("width", [100, 8, 0, -16, 2**63 - 2, True, 128.0])
def test_bucket_capacity_otherwise_is_rejected_naming_it(width):
    with pytest.raises(ValueError, match="bucket_capacity") as info:
        DynamicEmbTableOptions(bucket_capacity=width)
    assert repr(width) in str(info.value)


@pytest.mark.parametrize("factor", [1e-6, 0.5, 1.0, 1])
def test_max_load_factor_in_half_open_unit_interval_is_accepted(factor):
    assert DynamicEmbTableOptions(max_load_factor=factor).max_load_factor == factor


@pytest.mark.parametrize("factor", [0.0, -0.5, 1.01, 2, float("nan"), True])
def test_max_load_factor_outside_unit_interval_is_rejected_naming_it(factor):
    with pytest.raises(ValueError, match="max_load_factor") as info:
        DynamicEmbTableOptions(max_load_factor=factor)
    assert repr(factor) in str(info.value)


def test_int_enum_fields_accept_their_values():
    options = DynamicEmbTableOptions(safe_check_mode=0, evict_strategy=1, evicted_item_mode=1)
    assert options.safe_check_mode is DynamicEmbCheckMode.ERROR
    assert options.evict_strategy is DynamicEmbEvictStrategy.LFU
    assert options.evicted_item_mode is EvictedItemMode.RETAIN_KEY


def test_enum_field_rejects_a_member_of_another_enum():
    with pytest.raises(ValueError, match="safe_check_mode"):
        DynamicEmbTableOptions(safe_check_mode=DynamicEmbPoolingMode.SUM)


def test_enum_field_rejects_unknown_value_naming_it():
    with pytest.raises(ValueError, match="safe_check_mode.*7"):
        DynamicEmbTableOptions(safe_check_mode=7)


@pytest.mark.parametrize("name", ["dim", "max_capacity", "init_capacity"])
@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_sizes_must_be_positive_ints(name, value):
    with pytest.raises(ValueError, match=name) as info:
        DynamicEmbTableOptions(**{name: value})
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("name", ["local_hbm_for_values", "global_hbm_for_values"])
def test_memory_budgets_must_be_non_negative(name):
    with pytest.raises(ValueError, match=name):
        DynamicEmbTableOptions(**{name: -1})


def test_embedding_dtype_must_be_floating():
    assert DynamicEmbTableOptions(embedding_dtype=torch.bfloat16).embedding_dtype is torch.bfloat16
    with pytest.raises(ValueError, match="int32"):
        DynamicEmbTableOptions(embedding_dtype=torch.int32)


def test_index_type_must_be_an_integer_dtype():
    assert DynamicEmbTableOptions(index_type=torch.int32).index_type is torch.int32
    with pytest.raises(ValueError, match="float32"):
        DynamicEmbTableOptions(index_type=torch.float32)


def test_initializer_args_must_be_initializer_args():
    with pytest.raises(TypeError, match="initializer_args"):
        DynamicEmbTableOptions(initializer_args="uniform")


class _DictStorage(Storage):
    """A Storage subclass (never instantiated here)."""


def test_external_storage_takes_a_storage_subclass():
    assert DynamicEmbTableOptions(external_storage=_DictStorage).external_storage is _DictStorage
    with pytest.raises(TypeError, match="external_storage"):
        DynamicEmbTableOptions(external_storage=dict)


def test_dist_type_must_be_a_known_routing():
    for dist_type in ("continuous", "roundrobin", "hash_roundrobin"):
        assert DynamicEmbTableOptions(dist_type=dist_type).dist_type == dist_type
    with pytest.raises(ValueError, match="modulo"):
        DynamicEmbTableOptions(dist_type="modulo")


# ---------------------------------------------------------------- grouped key


class _Admit(AdmissionStrategy):
    def __init__(self, threshold):
        self.threshold = threshold

    @classmethod
    def create_admitter(cls, table_strategies, device):
        raise NotImplementedError

    def get_grouped_key(self):
        return self.threshold


def test_grouped_key_ignores_per_table_fields():
    a = DynamicEmbTableOptions(dim=8, max_capacity=1024, local_hbm_for_values=10)
    b = DynamicEmbTableOptions(
        dim=64,
        max_capacity=4096,
        init_capacity=128,
        global_hbm_for_values=1 << 20,
        device_id=1,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL),
    )
    assert a.get_grouped_key() == b.get_grouped_key()
    assert hash(a.get_grouped_key()) == hash(b.get_grouped_key())


def test_grouped_key_treats_none_index_type_as_default():
    assert (
        DynamicEmbTableOptions().get_grouped_key()
        == DynamicEmbTableOptions(index_type=torch.int64).get_grouped_key()
    )
    assert (
        DynamicEmbTableOptions().get_grouped_key()
        != DynamicEmbTableOptions(index_type=torch.int32).get_grouped_key()
    )


@pytest.mark.parametrize(
    "change",
    [
        {"embedding_dtype": torch.float16},
        {"training": False},
        {"caching": True},
        {"score_strategy": LFU},
        {"bucket_capacity": 1024},
        {"safe_check_mode": DynamicEmbCheckMode.ERROR},
        {"external_storage": _DictStorage},
        {"evicted_item_mode": EvictedItemMode.RETAIN_KEY},
        {"admit_strategy": _Admit(3)},
        {"dist_type": "hash_roundrobin"},
    ],
)
def test_grouped_key_separates_tables_that_cannot_fuse(change):
    assert (
        DynamicEmbTableOptions().get_grouped_key()
        != DynamicEmbTableOptions(**change).get_grouped_key()
    )


def test_grouped_key_separates_compound_orders():
    assert (
        DynamicEmbTableOptions(score_strategy=(TS, LFU)).get_grouped_key()
        != DynamicEmbTableOptions(score_strategy=(LFU, TS)).get_grouped_key()
    )


def test_grouped_key_uses_admission_strategy_grouped_key():
    same = DynamicEmbTableOptions(admit_strategy=_Admit(3)).get_grouped_key()
    assert same == DynamicEmbTableOptions(admit_strategy=_Admit(3)).get_grouped_key()
    assert same != DynamicEmbTableOptions(admit_strategy=_Admit(4)).get_grouped_key()


# ---------------------------------------------------------------- complete_initializer_args


def test_uniform_bounds_from_num_embeddings():
    completed = complete_initializer_args(DynamicEmbInitializerArgs(), emb_config(400))
    assert completed.lower == pytest.approx(-0.05)
    assert completed.upper == pytest.approx(0.05)
    assert completed.mode is DynamicEmbInitializerMode.UNIFORM


def test_uniform_bounds_without_config_are_zero_and_one():
    completed = complete_initializer_args(DynamicEmbInitializerArgs())
    assert (completed.lower, completed.upper) == (0.0, 1.0)


def test_uniform_keeps_a_bound_already_set():
    completed = complete_initializer_args(DynamicEmbInitializerArgs(lower=-0.5), emb_config(100))
    assert (completed.lower, completed.upper) == (-0.5, pytest.approx(0.1))
    completed = complete_initializer_args(DynamicEmbInitializerArgs(upper=0.25))
    assert (completed.lower, completed.upper) == (0.0, 0.25)


def test_completion_returns_a_new_object_and_leaves_the_input_alone():
    args = DynamicEmbInitializerArgs()
    completed = complete_initializer_args(args, emb_config(4))
    assert completed is not args
    assert (args.lower, args.upper) == (None, None)
    assert (completed.lower, completed.upper) == (-0.5, 0.5)


def test_truncated_normal_bounds_as_documented():
    # The options' documentation: lower and upper default to +-1/sqrt(N) for
    # UNIFORM and TRUNCATED_NORMAL; without a config, +-2 std_dev around the mean.
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.TRUNCATED_NORMAL)
    completed = complete_initializer_args(args, emb_config(4096))
    assert (completed.lower, completed.upper) == (-1 / 64, 1 / 64)
    assert (args.lower, args.upper) == (None, None)
    args = DynamicEmbInitializerArgs(
        mode=DynamicEmbInitializerMode.TRUNCATED_NORMAL, mean=1.0, std_dev=0.5, upper=1.25
    )
    completed = complete_initializer_args(args)
    assert (completed.lower, completed.upper) == (0.0, 1.25)


@pytest.mark.parametrize(
    "mode",
    [
        m
        for m in DynamicEmbInitializerMode
        if m not in (DynamicEmbInitializerMode.UNIFORM, DynamicEmbInitializerMode.TRUNCATED_NORMAL)
    ],
)
def test_other_modes_are_returned_unchanged(mode):
    args = DynamicEmbInitializerArgs(mode=mode)
    completed = complete_initializer_args(args, emb_config(100))
    assert completed == DynamicEmbInitializerArgs(mode=mode)
    assert (completed.lower, completed.upper) == (None, None)


def test_complete_uniform_args_are_returned_unchanged():
    args = DynamicEmbInitializerArgs(lower=-1.0, upper=2.0)
    assert complete_initializer_args(args, emb_config(100)) == args


def test_completion_with_a_real_torchrec_config():
    configs = pytest.importorskip("torchrec.modules.embedding_configs")
    config = configs.EmbeddingConfig(
        name="t", embedding_dim=8, num_embeddings=10000, feature_names=["f"]
    )
    completed = complete_initializer_args(DynamicEmbInitializerArgs(), config)
    assert (completed.lower, completed.upper) == (-0.01, 0.01)


# ---------------------------------------------------------------- sharded capacity


def test_align_to_table_size_rounds_up_to_whole_buckets_at_least_one():
    assert align_to_table_size(334, 128) == 384
    assert align_to_table_size(256, 128) == 256
    assert align_to_table_size(1, 128) == 128
    assert align_to_table_size(0, 128) == 128


def test_capacity_rounds_rows_per_rank_up_to_whole_buckets():
    # ceil(1000 / 3) = 334 rows per rank -> 3 buckets of 128.
    assert get_sharded_table_capacity(emb_config(1000), 3, 128) == 384
    assert _sharded_table_bucket_layout(emb_config(1000), 3, 128) == (3, 128)


def test_capacity_default_bucket_is_128():
    assert get_sharded_table_capacity(emb_config(1000), 3) == 384


def test_capacity_with_sentinel_is_one_bucket_of_aligned_rows():
    # 334 rows -> aligned to 16 -> 336, in a single bucket.
    assert get_sharded_table_capacity(emb_config(1000), 3, MAX_BUCKET_CAPACITY) == 336
    assert _sharded_table_bucket_layout(emb_config(1000), 3, MAX_BUCKET_CAPACITY) == (1, 336)


def test_capacity_with_exact_fit_adds_no_bucket():
    assert get_sharded_table_capacity(emb_config(768), 3, 128) == 256
    assert get_sharded_table_capacity(emb_config(768), 3, MAX_BUCKET_CAPACITY) == 256


def test_capacity_is_at_least_one_bucket_per_rank():
    assert get_sharded_table_capacity(emb_config(2), 8, 128) == 128
    assert get_sharded_table_capacity(emb_config(2), 8, MAX_BUCKET_CAPACITY) == 16


@pytest.mark.parametrize("width", [100, 8, 0, -128])
def test_capacity_rejects_unaligned_bucket_naming_it(width):
    with pytest.raises(ValueError, match="bucket_capacity") as info:
        get_sharded_table_capacity(emb_config(1000), 3, width)
    assert repr(width) in str(info.value)


@pytest.mark.parametrize("world_size", [0, -1, 2.0])
def test_capacity_rejects_bad_world_size(world_size):
    with pytest.raises(ValueError, match="world_size"):
        get_sharded_table_capacity(emb_config(1000), world_size, 128)


def test_capacity_rejects_bad_num_embeddings():
    with pytest.raises(ValueError, match="num_embeddings"):
        get_sharded_table_capacity(emb_config(0), 2, 128)


@settings(max_examples=200, deadline=None)
@given(
    num_embeddings=st.integers(1, 10**12),
    world_size=st.integers(1, 1024),
    buckets_of_16=st.integers(1, 256),
)
def test_capacity_is_the_smallest_whole_bucket_cover_of_a_rank_shard(
    num_embeddings, world_size, buckets_of_16
):
    width = 16 * buckets_of_16
    rows = ceil_div(num_embeddings, world_size)
    capacity = get_sharded_table_capacity(emb_config(num_embeddings), world_size, width)
    assert capacity % width == 0
    assert rows <= capacity < rows + width or capacity == width
    single = get_sharded_table_capacity(emb_config(num_embeddings), world_size, MAX_BUCKET_CAPACITY)
    assert single % 16 == 0 and rows <= single < rows + 16


# ---------------------------------------------------------------- value bytes


def _emb_optim_type():
    return pytest.importorskip("fbgemm_gpu.split_embedding_configs").EmbOptimType


def test_optimizer_state_dim_rule():
    EmbOptimType = _emb_optim_type()
    f32, f16 = torch.float32, torch.float16
    assert optimizer_state_dim(EmbOptimType.SGD, 16, f32) == 0
    assert optimizer_state_dim(EmbOptimType.EXACT_SGD, 16, f32) == 0
    assert optimizer_state_dim(EmbOptimType.ADAM, 16, f32) == 32
    assert optimizer_state_dim(EmbOptimType.EXACT_ADAGRAD, 16, f32) == 16
    # 16 bytes per row, whatever the dtype.
    assert optimizer_state_dim(EmbOptimType.EXACT_ROWWISE_ADAGRAD, 16, f32) == 4
    assert optimizer_state_dim(EmbOptimType.EXACT_ROWWISE_ADAGRAD, 16, f16) == 8
    assert optimizer_state_dim(EmbOptimType.EXACT_ROWWISE_ADAGRAD, 16, torch.bfloat16) == 8
    assert optimizer_state_dim(DynamicEmbOptimType.FTRL, 16, f32) == 32
    assert optimizer_state_dim(DynamicEmbOptimType.ROWWISE_RMSPROP_AR, 16, f32) == 4
    assert optimizer_state_dim(DynamicEmbOptimType.ROWWISE_RMSPROP_AR, 16, f16) == 8


def test_ftrl_state_dim_needs_no_fbgemm():
    assert optimizer_state_dim(DynamicEmbOptimType.FTRL, 7, torch.float32) == 14


@pytest.mark.parametrize("bad", ["adam", None, DynamicEmbScoreStrategy.LFU])
def test_optimizer_state_dim_rejects_non_optimizers_naming_them(bad):
    with pytest.raises(ValueError) as info:
        optimizer_state_dim(bad, 16, torch.float32)
    assert repr(bad) in str(info.value)


def test_optimizer_state_dim_rejects_unsupported_emb_optim_type():
    EmbOptimType = _emb_optim_type()
    for member in (EmbOptimType.LAMB, EmbOptimType.PARTIAL_ROWWISE_ADAM):
        with pytest.raises(ValueError, match=f"{member.name}.*implement EmbOptimType.SGD"):
            optimizer_state_dim(member, 16, torch.float32)


def test_value_bytes_per_optimizer():
    EmbOptimType = _emb_optim_type()
    config = emb_config(1000, 16, torch.float32)
    rows, world = 384, 3  # ceil(1000 / 3) = 334 -> 3 buckets of 128
    expected = {
        EmbOptimType.SGD: rows * 16 * 4 * world,
        EmbOptimType.EXACT_SGD: rows * 16 * 4 * world,
        EmbOptimType.ADAM: rows * (16 + 32) * 4 * world,
        EmbOptimType.EXACT_ADAGRAD: rows * (16 + 16) * 4 * world,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD: rows * (16 * 4 + 16) * world,
        DynamicEmbOptimType.FTRL: rows * (16 + 32) * 4 * world,
    }
    for optimizer, value in expected.items():
        assert get_table_value_bytes(config, optimizer, world, 128) == value, optimizer


def test_value_bytes_with_sentinel_bucket_and_half_precision():
    EmbOptimType = _emb_optim_type()
    config = emb_config(1000, 16, torch.float16)
    # 336 rows per rank; rowwise Adagrad keeps 16 bytes = 8 halves per row.
    assert (
        get_table_value_bytes(config, EmbOptimType.EXACT_ROWWISE_ADAGRAD, 3, MAX_BUCKET_CAPACITY)
        == 336 * (16 + 8) * 2 * 3
    )


def test_value_bytes_default_bucket_is_128():
    config = emb_config(1000, 16)
    assert get_table_value_bytes(config, DynamicEmbOptimType.FTRL, 3) == 384 * 48 * 4 * 3


def test_value_bytes_rejects_unaligned_bucket_naming_it():
    with pytest.raises(ValueError, match="100"):
        get_table_value_bytes(emb_config(1000), DynamicEmbOptimType.FTRL, 3, 100)


def test_value_bytes_with_a_real_torchrec_config():
    configs = pytest.importorskip("torchrec.modules.embedding_configs")
    EmbOptimType = _emb_optim_type()
    config = configs.EmbeddingConfig(
        name="t",
        embedding_dim=32,
        num_embeddings=1000,
        feature_names=["f"],
        data_type=configs.DataType.BF16,
    )
    # bfloat16 embeddings (32 x 2 bytes), Adam's state in float32 (64 x 4 bytes).
    assert get_table_value_bytes(config, EmbOptimType.ADAM, 2, 128) == 512 * (32 * 2 + 64 * 4) * 2


def test_value_row_bytes_pads_the_embedding_and_keeps_the_state_float32():
    EmbOptimType = _emb_optim_type()
    from dynamicemb.dynamicemb_config import value_row_bytes

    assert value_row_bytes(EmbOptimType.EXACT_SGD, 7, torch.float32) == 28
    assert value_row_bytes(EmbOptimType.EXACT_SGD, 7, torch.float16) == 16  # 14 -> 16
    assert value_row_bytes(EmbOptimType.ADAM, 7, torch.bfloat16) == 16 + 14 * 4
    assert value_row_bytes(EmbOptimType.EXACT_ROWWISE_ADAGRAD, 3, torch.float16) == 8 + 16
    assert value_row_bytes(EmbOptimType.ADAM, 7, torch.float16, training=False) == 16
    assert value_row_bytes(None, 5, torch.float32) == 20
    with pytest.raises(ValueError, match="float64"):
        value_row_bytes(EmbOptimType.ADAM, 7, torch.float64)


# ---------------------------------------------------------------- planner constraints


def test_parameter_constraints_defaults():
    pytest.importorskip("torchrec")
    from torchrec.distributed.planner.types import ParameterConstraints

    from dynamicemb.planner import DynamicEmbParameterConstraints

    constraints = DynamicEmbParameterConstraints()
    assert isinstance(constraints, ParameterConstraints)
    assert dataclasses.is_dataclass(constraints)
    assert constraints.use_dynamicemb is False
    assert constraints.dynamicemb_options == DynamicEmbTableOptions()
    assert constraints.dynamicemb_options is not DynamicEmbParameterConstraints().dynamicemb_options
    names = [f.name for f in dataclasses.fields(DynamicEmbParameterConstraints)]
    assert names[-2:] == ["use_dynamicemb", "dynamicemb_options"]


def test_parameter_constraints_keep_torchrec_fields_and_hash_by_content():
    pytest.importorskip("torchrec")
    from dynamicemb.planner import DynamicEmbParameterConstraints

    a = DynamicEmbParameterConstraints(
        sharding_types=["row_wise"],
        use_dynamicemb=True,
        dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=1024),
    )
    b = DynamicEmbParameterConstraints(
        sharding_types=["row_wise"],
        use_dynamicemb=True,
        dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=1024),
    )
    assert a.sharding_types == ["row_wise"]
    assert hash(a) == hash(b)
    assert hash(a) != hash(DynamicEmbParameterConstraints(sharding_types=["row_wise"]))
