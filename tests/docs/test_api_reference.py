"""The API reference (tools/api_docs.py): Sphinx renders every public module's
docstrings with warnings as errors, and documents every name the specification
imports (docs/api/spec_imports.txt)."""

import importlib.util
from pathlib import Path

import pytest


def _tool():
    for root in (Path.cwd(), Path(__file__).parents[2]):
        path = root / "tools" / "api_docs.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location("api_docs", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise FileNotFoundError("tools/api_docs.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    api_docs = _tool()
    out = tmp_path_factory.mktemp("api")
    assert api_docs.build(str(out)) == 0, "the Sphinx build failed (see its warnings above)"
    return api_docs, api_docs.documented(str(out))


def test_every_name_the_spec_imports_is_documented(built):
    api_docs, names = built
    wanted = api_docs.spec_imports()
    assert len(wanted) >= 20 and ("dynamicemb", "DynamicEmbTableOptions") in wanted
    assert api_docs.missing(names, wanted) == []


def test_a_name_documented_elsewhere_counts_and_an_undocumented_one_does_not(built):
    api_docs, names = built
    # complete_initializer_args is documented on the dynamicemb_config page; the
    # top-level package's names on its own page; a private helper nowhere.
    assert "dynamicemb.dynamicemb_config.complete_initializer_args" in names
    assert "dynamicemb.DynamicEmbTableOptions" in names
    lacking = api_docs.missing(names, [("dynamicemb.dynamicemb_config", "_warn_ignored_options")])
    assert lacking == ["dynamicemb.dynamicemb_config._warn_ignored_options"]


def test_every_top_level_name_is_documented(built):
    import dynamicemb

    _, names = built
    assert sorted(n for n in dynamicemb.__all__ if f"dynamicemb.{n}" not in names) == []
