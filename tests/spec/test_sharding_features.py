"""The sharded embedding kernel as the spec states it, through the spec's
names: ``dim`` "The embedding kernel only warns if it differs from the
sharded ``local_cols``", and the table is built with the sharded columns
(the width TorchRec lays the lookup's output out by)."""

import dataclasses
import warnings

import torch

from tests.spec import spec_model as sm


def _narrow_dim_world(rank, world):
    from dynamicemb import DynamicEmbTableOptions

    tables = [sm.Table("t", DynamicEmbTableOptions())]

    def edit(plan):
        # A plan edited by hand: the options say 4 where the table is 8 wide.
        entry = plan.plan["coll"]["t"]
        entry.dynamicemb_options = dataclasses.replace(entry.dynamicemb_options, dim=4)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = sm.build(tables, edit_plan=edit)
    sm.train(model, tables, range(2), rank)
    keys = torch.arange(0, 64)
    return {
        "warnings": [str(w.message) for w in caught if "dim" in str(w.message)],
        "rows": sm.lookup(model, tables, keys)["t"],
    }


def test_the_kernel_warns_of_a_dim_other_than_the_sharded_columns_and_uses_them():
    for out in sm.run_world(_narrow_dim_world, 2):
        assert any("table 't'" in w and "(4)" in w and "(8)" in w for w in out["warnings"]), out[
            "warnings"
        ]
        rows = out["rows"]
        assert rows.shape == (64, sm.DIM)
        # Trained keys read rows of every column.
        held = rows.abs().sum(1) > 0
        assert held.any() and bool((rows[held] != 0).all())
