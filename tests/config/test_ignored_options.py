"""Options a table accepts but does not act on warn, once per process; a
TorchRec config's weight_init_min / weight_init_max likewise."""

import warnings

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingConfig

from dynamicemb import (
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb import _warnings as once
from dynamicemb.dynamicemb_config import complete_initializer_args

IGNORED = [
    ("evict_strategy", dict(evict_strategy=DynamicEmbEvictStrategy.LFU), "score_strategy"),
    ("device_id", dict(device_id=1), "device"),
    ("index_type", dict(index_type=torch.int32), "int64"),
]


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught]


@pytest.mark.parametrize("name, kwargs, hint", IGNORED, ids=[i[0] for i in IGNORED])
def test_an_ignored_option_warns_once_naming_itself_and_what_to_use(name, kwargs, hint):
    once.forget(f"DynamicEmbTableOptions.{name}")
    options, first = _caught(lambda: DynamicEmbTableOptions(**kwargs))
    assert len(first) == 1 and f"DynamicEmbTableOptions.{name}=" in first[0], first
    assert hint in first[0] and "has no effect" in first[0]
    assert getattr(options, name) == kwargs[name]  # accepted as given
    # Neither a second table nor a copy (the planner's dataclasses.replace) warns again.
    _, again = _caught(lambda: DynamicEmbTableOptions(dim=8, **kwargs))
    assert again == []


def test_the_defaults_and_settings_that_act_do_not_warn():
    for key in ("evict_strategy", "device_id", "index_type"):
        once.forget(f"DynamicEmbTableOptions.{key}")
    _, got = _caught(
        lambda: [
            DynamicEmbTableOptions(),
            DynamicEmbTableOptions(index_type=torch.int64),
            DynamicEmbTableOptions(score_strategy=DynamicEmbScoreStrategy.LFU),
        ]
    )
    assert got == []


def test_weight_init_bounds_of_a_dynamic_tables_config_warn_once():
    once.forget("weight_init")
    config = EmbeddingConfig(
        name="user",
        num_embeddings=100,
        embedding_dim=8,
        feature_names=["f"],
        weight_init_min=-0.01,
        weight_init_max=0.01,
    )
    args, got = _caught(lambda: complete_initializer_args(DynamicEmbInitializerArgs(), config))
    assert len(got) == 1, got
    assert "'user'" in got[0] and "weight_init_max" in got[0] and "initializer_args" in got[0]
    # The spec's completion, whatever the config's bounds say.
    assert (args.lower, args.upper) == (-0.1, 0.1)
    _, again = _caught(lambda: complete_initializer_args(DynamicEmbInitializerArgs(), config))
    assert again == []


def test_a_config_without_weight_init_bounds_does_not_warn():
    once.forget("weight_init")
    config = EmbeddingConfig(name="user", num_embeddings=100, embedding_dim=8, feature_names=["f"])
    _, got = _caught(lambda: complete_initializer_args(DynamicEmbInitializerArgs(), config))
    assert got == []


def test_warn_once_is_once_per_key_whatever_the_filters():
    once.forget("k")
    _, got = _caught(lambda: [once.warn_once("k", "a"), once.warn_once("k", "a")])
    assert got == ["a"]
    once.forget("k")
    _, got = _caught(lambda: once.warn_once("k", "b"))
    assert got == ["b"]
