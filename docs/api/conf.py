"""Sphinx configuration of dynamicemb's API reference (docs/api).

Build it with ``python tools/api_docs.py`` (warnings are errors; it also checks
that every name the specification imports is documented). The module pages are
generated here, at the start of a build, from ``MODULES``: one page per public
module, listing the names of its ``__all__``; a name several modules export is
documented once, on the page of the first module that exports it.
"""

import importlib
import inspect
import os
import sys

# The checkout's root, for a build from docs/api or from a copy of it next to the root.
sys.path.insert(0, os.environ.get("DYNAMICEMB_ROOT", os.path.abspath("../..")))

import dynamicemb

project = "dynamicemb"
copyright = "dynamicemb authors; Apache License 2.0"
version = release = dynamicemb.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
# The docstrings are Google style (Args:, Returns:, Raises:, Attributes:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Type hints name torch, torchrec and FBGEMM classes that are not documented here.
nitpicky = False
# A Returns section names a tuple's fields, "(slots, rows): ...", which Sphinx takes
# for types; a field name several classes have as an attribute (slots) links to the
# first of them instead of warning.
suppress_warnings = ["ref.python"]
html_theme = "alabaster"
html_title = f"dynamicemb {release} API reference"
exclude_patterns = ["_build"]

# Public modules, in the order that decides where a name exported by several is documented.
MODULES = [
    ("dynamicemb", "Configuration, enums, checkpoints, replication (the top-level names)"),
    ("dynamicemb.dynamicemb_config", "Configuration: the sizing rules and constants"),
    ("dynamicemb.types", "Interfaces: storage, admission, counters"),
    ("dynamicemb.planner", "Planning: TorchRec's planner with dynamic tables"),
    ("dynamicemb.shard", "Sharding: sharders and sharded modules"),
    ("dynamicemb.embedding", "The embedding module"),
    ("dynamicemb.storage", "Storage tiers"),
    ("dynamicemb.table", "The scored hash table"),
    ("dynamicemb.admission", "Admission"),
    ("dynamicemb.checkpoint", "Checkpoints"),
    ("dynamicemb.incremental_dump", "Incremental dumps and replays (the specification's names)"),
    ("dynamicemb.replication", "Replication"),
    ("dynamicemb.inference", "Serving: the inference table"),
    ("dynamicemb.metrics", "Metrics"),
    ("dynamicemb.io", "I/O: collectives, verified files, object stores"),
    ("dynamicemb.twin", "TorchRec twins"),
]


def _directive(module: str, name: str, obj) -> str:
    target = f"{module}.{name}"
    if inspect.isclass(obj):
        # An enum's members are in its docstring's Attributes section.
        return f".. autoclass:: {target}\n   :members:"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return f".. autofunction:: {target}"
    if inspect.ismodule(obj):
        return f".. py:module:: {target}\n   :no-index:"
    # A constant: its name and type (autodata would show the docstring of its type).
    # (py:data takes the name within the current module, set by automodule.)
    return f".. py:data:: {name}\n   :type: {type(obj).__name__}"


def _key(name: str, obj):
    """What a name stands for: the object for classes and functions, else the name."""
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return ("object", id(obj))
    return ("name", name)


def write_pages(app) -> None:
    out = os.path.join(app.srcdir, "reference")
    os.makedirs(out, exist_ok=True)
    documented = set()
    toctree = [".. toctree::", "   :maxdepth: 1", ""]
    for module, title in MODULES:
        toctree.append(f"   reference/{module}")
        mod = importlib.import_module(module)
        lines = [module, "=" * len(module), "", title + ".", "", f".. automodule:: {module}", ""]
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if _key(name, obj) in documented or inspect.ismodule(obj):
                continue
            documented.add(_key(name, obj))
            lines += [_directive(module, name, obj), ""]
        _write(os.path.join(out, module + ".rst"), "\n".join(lines))
    _write(os.path.join(out, "toctree.inc"), "\n".join(toctree) + "\n")


def _write(path: str, text: str) -> None:
    """Writes only what changed (Sphinx rereads a page whose file is newer)."""
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


def setup(app):
    app.connect("builder-inited", write_pages)
