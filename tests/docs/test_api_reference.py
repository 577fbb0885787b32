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
    return api_docs, api_docs.documented(str(out)), out


def test_every_name_the_spec_imports_is_documented(built):
    api_docs, names, _ = built
    wanted = api_docs.spec_imports()
    assert len(wanted) >= 20 and ("dynamicemb", "DynamicEmbTableOptions") in wanted
    assert api_docs.missing(names, wanted) == []


def test_a_name_documented_elsewhere_counts_and_an_undocumented_one_does_not(built):
    api_docs, names, _ = built
    # complete_initializer_args is documented on the dynamicemb_config page; the
    # top-level package's names on its own page; a private helper nowhere.
    assert "dynamicemb.dynamicemb_config.complete_initializer_args" in names
    assert "dynamicemb.DynamicEmbTableOptions" in names
    lacking = api_docs.missing(names, [("dynamicemb.dynamicemb_config", "_warn_ignored_options")])
    assert lacking == ["dynamicemb.dynamicemb_config._warn_ignored_options"]


def test_every_top_level_name_is_documented(built):
    import dynamicemb

    _, names, _ = built
    assert sorted(n for n in dynamicemb.__all__ if f"dynamicemb.{n}" not in names) == []


def _public_packages():
    """dynamicemb's public subpackages and top-level modules, by their files."""
    root = Path(__file__).resolve().parents[2] / "dynamicemb"
    names = [p.parent.name for p in root.glob("*/__init__.py") if not p.parent.name.startswith("_")]
    names += [p.stem for p in root.glob("*.py") if not p.stem.startswith("_")]
    return sorted(f"dynamicemb.{n}" for n in names)


def test_every_public_package_has_a_page(built):
    import ast

    conf = Path(__file__).resolve().parents[2] / "docs" / "api" / "conf.py"
    tree = ast.parse(conf.read_text())
    (modules,) = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODULES"
    ]
    listed = {m for m, _ in modules}
    assert [p for p in _public_packages() if p not in listed] == []
    _, _, out = built
    assert (out / "reference" / "dynamicemb.io.html").is_file()


def test_every_attribute_renders_as_one(built):
    """A Google-style attribute whose type spans two lines is not parsed: it
    shows up as raw "name (type): text" in a signature instead."""
    import re

    _, _, out = built
    raw = []
    for page in sorted((out / "reference").glob("*.html")):
        signatures = r'<dt class="sig sig-object py"[^>]*>(.*?)</dt>'
        for dt in re.findall(signatures, page.read_text(), re.S):
            text = re.sub(r"<[^>]+>", "", dt).strip()
            if re.match(r"^\w+ \(.*\):", text):
                raw.append(f"{page.name}: {text[:80]}")
    assert raw == []


def test_evict_strategy_says_it_has_no_effect(built):
    import re

    _, _, out = built
    page = (out / "reference" / "dynamicemb.html").read_text()
    i = page.index('id="dynamicemb.DynamicEmbTableOptions.evict_strategy"')
    text = re.sub(r"<[^>]+>", "", page[i : i + 1500])
    assert "without effect" in text and "eviction policy" not in text
