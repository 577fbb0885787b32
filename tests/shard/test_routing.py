"""Key -> rank routing (the route_keys op), the bucketization of the input
dist, index dedup, and the sharders' checks of plan entries."""

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb.shard import DIST_TYPE_CODES, bucketize_by_route, dedup_kjt, route_keys
from dynamicemb.shard.routing import route_keys_by_feature
from tests.devices import DEVICES
from tests.table.table_model import bucket_hash

MASK64 = (1 << 64) - 1


def _splitmix_route_hash(key: int) -> int:
    """The documented routing hash (cc/routing/routing.h) in plain Python."""
    x = (key + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x >> 1


def _expected_rank(key: int, dist_type: str, world_size: int, num_embeddings: int) -> int:
    if dist_type == "hash_roundrobin":
        return _splitmix_route_hash(key) % world_size
    block = -(-num_embeddings // world_size)
    if dist_type == "continuous" and 0 <= key < block * world_size:
        return key // block
    return key % world_size  # Python's % is a floor mod, as the op's


KEYS = [
    0,
    1,
    2,
    7,
    8,
    99,
    100,
    101,
    2**40 + 3,
    2**62,
    -1,
    -2,
    -5,
    -(2**62),
    2**63 - 1,
    -(2**63) + 4,
]


@pytest.mark.parametrize("dist_type", sorted(DIST_TYPE_CODES))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_route_keys_follows_the_documented_rule(dist_type, world_size):
    keys = torch.tensor(KEYS, dtype=torch.int64)
    ranks = route_keys(keys, world_size, dist_type, num_embeddings=100)
    want = [_expected_rank(k, dist_type, world_size, 100) for k in KEYS]
    assert ranks.tolist() == want
    assert bool(((ranks >= 0) & (ranks < world_size)).all())


def test_route_keys_by_feature_uses_each_features_rule():
    keys = torch.tensor([5, 5, 5, -3, 17, 17], dtype=torch.int64)
    features = torch.tensor([0, 1, 2, 0, 1, 2])
    codes = torch.tensor(
        [DIST_TYPE_CODES[d] for d in ("continuous", "roundrobin", "hash_roundrobin")]
    )
    blocks = torch.tensor([4, 1, 1])
    ranks = route_keys_by_feature(keys, features, codes, blocks, 3)
    assert ranks.tolist() == [1, 2, _splitmix_route_hash(5) % 3, 0, 2, _splitmix_route_hash(17) % 3]


@pytest.mark.parametrize("device", DEVICES)
def test_route_keys_opcheck(device):
    """The op's schema, its fake kernel against the real one, and tracing."""
    from dynamicemb.table import ops

    keys = torch.tensor([5, 5, 5, -3, 17, 17], device=device)
    codes = [DIST_TYPE_CODES[d] for d in ("continuous", "roundrobin", "hash_roundrobin")]
    torch.library.opcheck(
        ops().route_keys.default,
        (
            keys,
            torch.tensor([0, 1, 2, 0, 1, 2], device=device),
            torch.tensor(codes, device=device),
            torch.tensor([4, 1, 1], device=device),
            3,
        ),
    )


def test_route_keys_meta_kernel_gives_the_shape():
    keys = torch.empty(11, dtype=torch.int64, device="meta")
    out = route_keys_by_feature(
        keys,
        torch.empty_like(keys),
        torch.empty(2, dtype=torch.int64, device="meta"),
        torch.empty(2, dtype=torch.int64, device="meta"),
        4,
    )
    assert out.shape == (11,) and out.device.type == "meta" and out.dtype == torch.int64


def test_hash_roundrobin_keys_of_a_rank_spread_over_its_buckets():
    """Keys a rank owns under hash_roundrobin fill its buckets evenly; under the
    bucket hash itself they would crowd a subset (here: a quarter) of them."""
    world_size, buckets = 4, 64
    keys = torch.arange(0, 40000, 4, dtype=torch.int64)  # a stride roundrobin maps to one rank
    ranks = route_keys(keys, world_size, "hash_roundrobin")
    counts = torch.bincount(ranks, minlength=world_size)
    assert int(counts.min()) > 0.2 * keys.numel()
    mine = keys[ranks == 0].tolist()
    used = {bucket_hash(k) % buckets for k in mine}
    assert len(used) == buckets
    # The same rank split by the bucket hash itself: only buckets = 0 mod 4.
    same_hash = [k for k in keys.tolist() if bucket_hash(k) % world_size == 0]
    assert len({bucket_hash(k) % buckets for k in same_hash}) == buckets // world_size


def test_route_keys_rejects_bad_input():
    keys = torch.tensor([1, 2], dtype=torch.int64)
    with pytest.raises(ValueError, match="dist_type"):
        route_keys(keys, 2, "modulo")
    with pytest.raises(ValueError, match="world_size"):
        route_keys(keys, 0)
    with pytest.raises(ValueError, match="num_embeddings"):
        route_keys(keys, 2, "continuous")
    with pytest.raises(TypeError, match="int64"):
        route_keys(keys.int(), 2)
    with pytest.raises(ValueError, match="dist type 7"):
        route_keys_by_feature(keys, torch.zeros_like(keys), torch.tensor([7]), torch.tensor([1]), 2)
    with pytest.raises(ValueError, match="feature id 3"):
        route_keys_by_feature(keys, torch.tensor([0, 3]), torch.tensor([1]), torch.tensor([1]), 2)
    with pytest.raises(ValueError, match="block"):
        route_keys_by_feature(keys, torch.zeros_like(keys), torch.tensor([0]), torch.tensor([0]), 2)


def _kjt(weights=True):
    # Two features, stride 3.
    values = torch.tensor([4, 9, 4, 5, 3, 9, 9, -2, 6, 3, 3])
    lengths = torch.tensor([2, 0, 3, 1, 4, 1])
    w = torch.arange(values.numel(), dtype=torch.float32) + 1 if weights else None
    return KeyedJaggedTensor(keys=["a", "b"], values=values, lengths=lengths, weights=w)


def test_bucketize_by_route_groups_values_by_rank_and_keeps_raw_keys():
    kjt = _kjt()
    codes = torch.tensor([DIST_TYPE_CODES["roundrobin"], DIST_TYPE_CODES["hash_roundrobin"]])
    blocks = torch.ones(2, dtype=torch.int64)
    out, permute = bucketize_by_route(kjt, 2, codes, blocks, output_permute=True)
    assert out.keys() == ["a", "b", "a", "b"]
    assert out.stride() == 3
    # Rebuild the buckets by hand.
    want_values, want_lengths, want_weights = [], [], []
    offsets = [0] + torch.cumsum(kjt.lengths(), 0).tolist()
    for rank in range(2):
        for bag in range(6):
            feature = bag // 3
            vals = kjt.values()[offsets[bag] : offsets[bag + 1]].tolist()
            ws = kjt.weights()[offsets[bag] : offsets[bag + 1]].tolist()
            dist_type = "roundrobin" if feature == 0 else "hash_roundrobin"
            kept = [(v, w) for v, w in zip(vals, ws) if _expected_rank(v, dist_type, 2, 1) == rank]
            want_lengths.append(len(kept))
            want_values += [v for v, _ in kept]
            want_weights += [w for _, w in kept]
    assert out.lengths().tolist() == want_lengths
    assert out.values().tolist() == want_values
    assert out.weights().tolist() == want_weights
    # The permute takes every original value to its bucketized position.
    assert out.values()[permute].tolist() == kjt.values().tolist()


def test_dedup_kjt_keeps_first_occurrences_and_expands_back():
    kjt = _kjt()
    deduped, reverse = dedup_kjt(kjt)
    # Per feature, every key once, first occurrences in order.
    assert deduped.values().tolist() == [4, 9, 5, 3, 9, -2, 6, 3]
    assert deduped.lengths().tolist() == [2, 0, 2, 1, 3, 0]
    assert deduped.values()[reverse].tolist() == kjt.values().tolist()
    # Weights are summed per kept key.
    assert deduped.weights().tolist() == [1 + 3, 2, 4, 5, 6 + 7, 8, 9, 10 + 11]
    counted, _ = dedup_kjt(_kjt(weights=False), counts_as_weights=True)
    assert counted.weights().tolist() == [2, 1, 1, 1, 2, 1, 1, 2]
    plain, _ = dedup_kjt(_kjt(weights=False))
    assert plain.weights_or_none() is None


def test_variable_batch_is_refused():
    kjt = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3]),
        lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=[[1], [2]],
    )
    with pytest.raises(NotImplementedError, match="variable batch"):
        bucketize_by_route(kjt, 2, torch.tensor([1, 1]), torch.tensor([1, 1]))
    with pytest.raises(NotImplementedError, match="variable batch"):
        dedup_kjt(kjt)


def _info(name, ps):
    from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo
    from torchrec.modules.embedding_configs import EmbeddingTableConfig

    config = EmbeddingTableConfig(
        num_embeddings=10, embedding_dim=4, name=name, feature_names=["f"]
    )
    return EmbeddingShardingInfo(embedding_config=config, param_sharding=ps, param=torch.empty(0))


def _parameter_sharding(**overrides):
    from dynamicemb import DynamicEmbTableOptions
    from dynamicemb.planner.parameter_sharding import DynamicEmbParameterSharding

    fields = dict(
        sharding_type="row_wise",
        compute_kernel="customized_kernel",
        ranks=[0],
        sharding_spec=None,
        dynamicemb_options=DynamicEmbTableOptions(dim=4, max_capacity=128),
    )
    fields.update(overrides)
    return DynamicEmbParameterSharding(**fields)


def test_plan_entries_of_dynamic_tables_are_checked():
    from torchrec.distributed.types import ParameterSharding

    from dynamicemb.shard.sharding import prepare_dynamic_sharding_infos

    with pytest.raises(ValueError, match="'t'.*row_wise"):
        prepare_dynamic_sharding_infos(
            [_info("t", _parameter_sharding(sharding_type="table_wise"))]
        )
    with pytest.raises(ValueError, match="'t'.*customized_kernel"):
        prepare_dynamic_sharding_infos([_info("t", _parameter_sharding(compute_kernel="fused"))])
    with pytest.raises(ValueError, match="'t'.*DynamicEmbParameterSharding"):
        prepare_dynamic_sharding_infos(
            [
                _info(
                    "t",
                    ParameterSharding(sharding_type="row_wise", compute_kernel="fused", ranks=[0]),
                )
            ]
        )
    with pytest.raises(TypeError, match="'t'.*DynamicEmbTableOptions"):
        prepare_dynamic_sharding_infos(
            [_info("t", _parameter_sharding(dynamicemb_options={"dim": 4}))]
        )
    # Options that cannot share one module go to different groups; dist_type does not split.
    from dynamicemb import DynamicEmbScoreStrategy, DynamicEmbTableOptions

    lfu = DynamicEmbTableOptions(
        dim=4, max_capacity=128, score_strategy=DynamicEmbScoreStrategy.LFU
    )
    hashed = DynamicEmbTableOptions(dim=4, max_capacity=128, dist_type="hash_roundrobin")
    infos = prepare_dynamic_sharding_infos(
        [
            _info("a", _parameter_sharding()),
            _info("b", _parameter_sharding(dynamicemb_options=hashed)),
            _info("c", _parameter_sharding(dynamicemb_options=lfu)),
        ]
    )
    assert [i.fused_params["dynamicemb_group"] for i in infos] == [0, 0, 1]


def test_sharders_offer_the_customized_kernel_for_row_wise_only():
    from torchrec.distributed.embedding import EmbeddingCollectionSharder

    from dynamicemb.shard import (
        DynamicEmbeddingBagCollectionSharder,
        DynamicEmbeddingCollectionSharder,
    )

    for sharder in (DynamicEmbeddingCollectionSharder(), DynamicEmbeddingBagCollectionSharder()):
        assert "customized_kernel" in sharder.compute_kernels("row_wise", "cuda")
        assert "customized_kernel" in sharder.compute_kernels("row_wise", "cpu")
        assert "customized_kernel" not in sharder.compute_kernels("table_wise", "cuda")
    ec = DynamicEmbeddingCollectionSharder(use_index_dedup=True)
    assert isinstance(ec, EmbeddingCollectionSharder) and ec._use_index_dedup
