"""The main job's --preset criteo (examples/train_dlrm.py): the shape of
TorchRec's DLRM examples on the Criteo 1TB click logs.

26 sparse features, one id each, of Criteo 1TB's cardinalities (3 to
48,937,457 ids, 187,767,399 in all); dense features through TorchRec's
``DLRM`` (pairwise dot interaction) or ``DLRM_DCN`` (a DCN-v2 cross network of
3 low-rank layers), the layer sizes of TorchRec's DLRM example (dense arch
512, 256, dim; over arch 1024, 1024, 512, 256, 1). Each feature's dynamic table
holds every one of its ids where the memory budget allows; the largest are
capped at one row count, the largest that keeps all tables' rows (embedding
and optimizer state) within ``--emb-budget-gib``: beyond it they evict.
"""

NAME = "criteo"
# Distinct ids of each categorical feature of Criteo 1TB (C1 .. C26), as TorchRec's
# DLRM example sizes its tables.
CARDINALITIES = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
    2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
)  # fmt: skip
DIM = 128
BATCH_SIZE = 8192  # per rank: MLPerf's DLRM-DCNv2 global batch of 65,536 on 8 GPUs
EMB_BUDGET_GIB = 24.0
DENSE_ARCH = (512, 256)  # then the embedding dim
OVER_ARCH = (1024, 1024, 512, 256, 1)
DCN_LAYERS, DCN_LOW_RANK = 3, 512
INTERACTIONS = ("dot", "dcn")


def capacities(budget_bytes: float, row_bytes: int) -> list[int]:
    """Each feature's rows (its table's ``num_embeddings`` over all ranks):
    its cardinality, or the one cap on the largest that keeps the sum of
    rows times ``row_bytes`` within ``budget_bytes`` (every table at least
    one row; a rank rounds its share up to whole buckets)."""
    rows = int(budget_bytes // row_bytes)
    if rows < len(CARDINALITIES):
        raise ValueError(
            f"a budget of {budget_bytes / 2**30:.3g} GiB holds {rows} rows of {row_bytes} bytes, "
            f"fewer than one for each of the {len(CARDINALITIES)} features"
        )
    if sum(CARDINALITIES) <= rows:
        return list(CARDINALITIES)
    lo, hi = 1, max(CARDINALITIES)  # the largest cap whose tables fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in CARDINALITIES) <= rows:
            lo = mid
        else:
            hi = mid - 1
    return [min(c, lo) for c in CARDINALITIES]


def layer_sizes(dim: int, interaction: str) -> dict[str, list[int] | int]:
    """The dense layers: what makes a checkpoint this model's."""
    sizes: dict[str, list[int] | int] = {
        "dense_arch": [*DENSE_ARCH, dim],
        "over_arch": list(OVER_ARCH),
    }
    if interaction == "dcn":
        sizes.update(dcn_layers=DCN_LAYERS, dcn_low_rank=DCN_LOW_RANK)
    return sizes


def features(feature, names: list[str], args, row_bytes: int) -> tuple:
    """The features of --preset criteo, made by ``feature`` (the job's
    Feature) under the column ``names``: a dynamic table for each, of its
    cardinality's rows or the cap that keeps all rows of ``row_bytes``
    within --emb-budget-gib; generated ids drawn from its cardinality's ids
    (files bring their own)."""
    rows = capacities(args.emb_budget_gib * 2**30, row_bytes)
    generated = args.data is None
    return tuple(
        feature(name, capacity=cap, vocab=card if generated else None, max_length=1)
        for name, card, cap in zip(names, CARDINALITIES, rows, strict=True)
    )
