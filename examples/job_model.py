"""The main job's model (examples/train_dlrm.py): its own DLRM (bottom MLP,
pooled embeddings, pairwise dot interaction, top MLP), or with --preset
TorchRec's ``DLRM`` or ``DLRM_DCN`` at the sizes of criteo_preset.py; and
what makes a checkpoint this model's."""

from typing import Any

import click_data  # examples/click_data.py, next to this script
import criteo_preset  # examples/criteo_preset.py
import torch


def mlp(sizes: list[int], last_activation: bool) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    """Bottom MLP, pooled embeddings, pairwise dot interaction, top MLP."""

    def __init__(self, ebc: torch.nn.Module, dim: int, features) -> None:
        super().__init__()
        self.sparse_arch = ebc
        bottom, top = self.layer_sizes(dim, len(features))
        self.bottom_mlp = mlp(bottom, last_activation=True)
        self.top_mlp = mlp(top, last_activation=False)
        n = len(features) + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.feature_names = [f.name for f in features]

    @staticmethod
    def layer_sizes(dim: int, num_sparse: int) -> tuple[list[int], list[int]]:
        """The bottom and top MLPs' layer widths."""
        n = num_sparse + 1
        return [click_data.NUM_DENSE, 64, dim], [dim + n * (n - 1) // 2, 64, 32, 1]

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        x = self.bottom_mlp(dense)
        pooled = self.sparse_arch(sparse).to_dict()
        stacked = torch.stack([x] + [pooled[f] for f in self.feature_names], dim=1)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        pairs = dots[:, self.pair_rows, self.pair_cols]
        return self.top_mlp(torch.cat([x, pairs], dim=1)).squeeze(1)


def make_model(ebc: torch.nn.Module, features, args) -> torch.nn.Module:
    """The model over the sparse part ``ebc``: the job's DLRM, or with
    --preset TorchRec's DLRM or DLRM_DCN (--interaction)."""
    if args.preset is not None:
        return TorchRecDLRM(ebc, click_data.NUM_DENSE, args.dim, args.interaction)
    return DLRM(ebc, args.dim, features)


def model_description(features, args) -> dict[str, Any]:
    """What makes a checkpoint this model's: its tables, dims, layers and
    embedding optimizer (train_checkpoint.check_matches)."""
    desc: dict[str, Any] = {
        "tables": {
            f.table: {"feature": f.name, "capacity": f.capacity, "dynamic": f.dynamic}
            for f in features
        },
        "dim": args.dim,
    }
    if args.preset is None:
        desc["bottom_mlp"], desc["top_mlp"] = DLRM.layer_sizes(args.dim, len(features))
    else:
        desc.update(preset=args.preset, interaction=args.interaction)
        desc.update(criteo_preset.layer_sizes(args.dim, args.interaction))
    desc["emb_optimizer"] = args.emb_optimizer
    return desc


class TorchRecDLRM(torch.nn.Module):
    """TorchRec's ``DLRM`` or ``DLRM_DCN`` over ``ebc`` (its ``sparse_arch``),
    giving one logit per example as the job's own DLRM does."""

    def __init__(self, ebc, num_dense: int, dim: int, interaction: str) -> None:
        super().__init__()
        from torchrec.models.dlrm import DLRM, DLRM_DCN

        sizes = criteo_preset.layer_sizes(dim, interaction)
        common = {
            "embedding_bag_collection": ebc,
            "dense_in_features": num_dense,
            "dense_arch_layer_sizes": sizes["dense_arch"],
            "over_arch_layer_sizes": sizes["over_arch"],
        }
        if interaction == "dcn":
            self.dlrm = DLRM_DCN(
                **common, dcn_num_layers=sizes["dcn_layers"], dcn_low_rank_dim=sizes["dcn_low_rank"]
            )
        else:
            self.dlrm = DLRM(**common)

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        return self.dlrm(dense, sparse).squeeze(1)
