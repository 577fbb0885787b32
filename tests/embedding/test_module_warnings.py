"""What the module says once instead of failing later or silently: a state
dict without the tables' rows, rows all in host memory for want of a device
budget, a default optimizer that needs FBGEMM."""

import sys
import warnings

import pytest
import torch

from dynamicemb import DynamicEmbOptimType, DynamicEmbTableOptions
from dynamicemb import _warnings as once
from dynamicemb.dynamicemb_config import value_row_bytes
from dynamicemb.embedding import BatchedDynamicEmbeddingTablesV2, module_warnings


def _module(**options):
    return BatchedDynamicEmbeddingTablesV2(
        [DynamicEmbTableOptions(dim=4, max_capacity=128, **options)], learning_rate=0.1
    )


def _messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def test_state_dict_warns_once_naming_the_checkpoint_apis():
    once.forget("state_dict_without_rows")
    model = torch.nn.Sequential(_module())
    model[0](torch.tensor([1, 2, 3]), torch.tensor([0, 1, 3]))
    got = _messages(lambda: [model.state_dict(), model.state_dict(), _module().state_dict()])
    assert len(got) == 1, got
    assert "DynamicEmbDump" in got[0] and "dynamicemb sharders" in got[0]
    # It says what the state dict lacks: no key holds the table's rows.
    assert all(v.numel() <= 1 for v in model.state_dict().values())


def _zero_budget_options(n=2, **kwargs):
    return [DynamicEmbTableOptions(dim=4, max_capacity=128, **kwargs) for _ in range(n)]


def test_a_gpu_table_without_device_budget_says_so_once_naming_the_option():
    once.forget("host_only_rows")
    cuda = torch.device("cuda", 0)
    rb = value_row_bytes(None, 4, torch.float32, False)
    got = _messages(
        lambda: [
            module_warnings.warn_if_host_only(_zero_budget_options(), cuda),
            module_warnings.warn_if_host_only(_zero_budget_options(), cuda),
        ]
    )
    assert len(got) == 1 and "global_hbm_for_values" in got[0] and "[0, 1]" in got[0], got
    once.forget("host_only_rows")
    # With a budget, on the CPU, or as a cache (which needs a budget anyway): quiet.
    quiet = _messages(
        lambda: [
            module_warnings.warn_if_host_only(
                _zero_budget_options(local_hbm_for_values=64 * rb), cuda
            ),
            module_warnings.warn_if_host_only(_zero_budget_options(), torch.device("cpu")),
            module_warnings.warn_if_host_only(_zero_budget_options(caching=True), cuda),
        ]
    )
    assert quiet == []


@pytest.mark.gpu
def test_a_cuda_module_with_the_default_budget_warns():
    once.forget("host_only_rows")
    got = _messages(lambda: BatchedDynamicEmbeddingTablesV2(_zero_budget_options(1), device="cuda"))
    assert any("global_hbm_for_values" in m for m in got), got


def test_the_default_optimizer_without_fbgemm_says_what_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "fbgemm_gpu" or m.startswith("fbgemm_gpu.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fbgemm_gpu", None)  # import fbgemm_gpu fails
    with pytest.raises(ImportError, match="fbgemm-gpu-cpu.*fbgemm-gpu.*FTRL"):
        _module()
    # An optimizer of dynamicemb's own needs no FBGEMM.
    BatchedDynamicEmbeddingTablesV2(
        [DynamicEmbTableOptions(dim=4, max_capacity=128)], optimizer=DynamicEmbOptimType.FTRL
    )
