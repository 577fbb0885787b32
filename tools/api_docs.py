"""Builds the API reference from the docstrings (Sphinx autodoc), warnings as errors,
and checks that it documents every name the specification imports.

    python tools/api_docs.py                  # HTML into docs/_build/api (open index.html)
    python tools/api_docs.py --out DIR

The sources (docs/api: conf.py, index.rst, spec_imports.txt) are copied into a
temporary directory and built there, so the checkout stays clean and a read-only
tree (Bazel's runfiles) builds too; conf.py generates the module pages. Then every
"module name" line of docs/api/spec_imports.txt (the names programs import)
must resolve to an object the built reference documents (objects.inv): under that
name, or under the module that documents it when several export it. Exits non-zero
and says what is missing otherwise. //tests/docs runs it (so `bazel test //...`).
"""

import argparse
import importlib
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = os.path.join(ROOT, "docs", "api")
SPEC_IMPORTS = os.path.join(SOURCES, "spec_imports.txt")


def spec_imports(path=SPEC_IMPORTS):
    """[(module, name)] of spec_imports.txt."""
    with open(path) as f:
        lines = [line.split() for line in f if line.strip() and not line.startswith("#")]
    return [(module, name) for module, name in lines]


def build(out: str) -> int:
    """Builds the HTML reference into ``out``; Sphinx's exit code."""
    from sphinx.cmd.build import build_main

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "api")
        shutil.copytree(SOURCES, src, ignore=shutil.ignore_patterns("reference", "_build"))
        os.environ["DYNAMICEMB_ROOT"] = ROOT
        doctrees = os.path.join(tmp, "doctrees")
        return build_main(["-W", "--keep-going", "-q", "-b", "html", "-d", doctrees, src, out])


def documented(out: str) -> dict[str, str]:
    """{full name: role} of the Python objects in the built reference."""
    from sphinx.util.inventory import InventoryFile

    with open(os.path.join(out, "objects.inv"), "rb") as f:
        inventory = InventoryFile.load(f, "", os.path.join)
    items = inventory.data.items() if hasattr(inventory, "data") else inventory.items()
    names = {}
    for role, entries in items:
        if role.startswith("py:"):
            for name in entries:
                names[name] = role
    return names


def missing(names: dict[str, str], wanted) -> list[str]:
    """The spec's names the reference does not document."""
    by_object = {}
    for full in names:
        module, _, attr = full.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError):
            continue
        by_object.setdefault(id(obj), set()).add(attr)
    lacking = []
    for module, name in wanted:
        if f"{module}.{name}" in names:
            continue
        obj = getattr(importlib.import_module(module), name)
        if name not in by_object.get(id(obj), ()):
            lacking.append(f"{module}.{name}")
    return lacking


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "_build", "api"))
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    code = build(args.out)
    if code:
        print(f"api_docs: the Sphinx build failed (exit code {code})", file=sys.stderr)
        return 1
    wanted = spec_imports()
    lacking = missing(documented(args.out), wanted)
    if lacking:
        print(f"api_docs: the reference lacks {lacking}", file=sys.stderr)
        return 1
    print(
        f"api_docs: {os.path.join(args.out, 'index.html')}; all {len(wanted)} names the "
        "specification imports are documented"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
