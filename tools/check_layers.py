"""The structure rules of the Python package, checked from the sources alone
(run by tools/lint.sh; no import of the package, no torch).

1. Layers: a package imports only packages of a lower layer (``LAYERS``, from
   the bottom up; docs/architecture.md says why each sits where it does).
   Every import counts, also one inside a function.
2. Bazel sees every import: a package with a BUILD.bazel lists each package
   it imports in the deps of its py_library (``//dynamicemb/<pkg>``, or
   ``//dynamicemb:core`` for the top-level modules), and no module imports
   a dynamicemb module by a string (``importlib``), which nothing can see.
3. One door to the native extension: only ``dynamicemb/table`` imports
   ``_native`` or ``dynamicemb._C``.
4. Checkpoints, replication and metrics reach rows through ``TableRows``
   (``dynamicemb.storage``), never through the embedding package (the
   training module ``BatchedDynamicEmbeddingTablesV2`` included, by any path).
5. No module of the package is longer than ``MAX_LINES`` lines
   (``dynamicemb_config.py``, whose path and contents the spec fixes, aside), and no
   file of ``examples/`` longer than ``MAX_EXAMPLE_LINES``: an example is read top
   to bottom, its machinery in modules beside it.
6. A serving package (``SERVING``: ``dynamicemb/inference``) imports only
   the readers of the packages below it (``SERVING_IMPORTS``), never their
   training side (the embedding module, the sharders, the storage tiers, a
   model's dumps, loads and replays): a serving process loads none of it.
7. A test package's BUILD.bazel depends on every other test package it imports
   (``tests.<pkg>``: a ``//tests/<pkg>`` label in it), and on ``//dynamicemb``
   where it imports ``dynamicemb.incremental_dump`` (only that target holds
   it), or the test fails to import in Bazel's sandbox although it runs under
   plain pytest.
8. Every test file of a test package (``test_*.py``, ``*_test.py``) is in a
   ``pytest_test`` target of its BUILD.bazel: one without ``srcs`` (every file
   of the package) or one whose ``srcs`` name it. A file in none would run
   under plain pytest and never in ``bazel test``.
9. No module reads or writes another object's private attributes: ``x._name``
   (or ``getattr(x, "_name")``, ``setattr``, ``hasattr``, ``delattr``)
   where ``x`` is not ``self``, ``cls`` or ``super()`` is refused (the owner
   offers a public method or property instead), except the few uses of
   other projects' private names listed in ``FOREIGN_PRIVATE``, each with
   the reason it has no public way.

    python tools/check_layers.py [repository root]
"""

import ast
import pathlib
import re
import sys

MAX_LINES = 800
MAX_EXAMPLE_LINES = 600
LONG_MODULES = {"dynamicemb/dynamicemb_config.py"}

# Layer of each package, bottom up; "core" is the top-level modules everything
# imports (configuration, types, argument checks), "root" the package's
# __init__.py and incremental_dump.py, which gather the public names.
LAYERS = {
    "core": 0,
    "io": 1,
    "table": 1,
    "storage": 2,
    "embedding": 3,
    "planner": 3,
    "admission": 4,
    "shard": 5,
    "twin": 5,
    "checkpoint": 6,
    "metrics": 6,
    "replication": 7,
    "inference": 8,
    "root": 9,
}
TOP_LEVEL = {
    "__init__": "root",
    "incremental_dump": "root",
    "twin": "twin",
    "dynamicemb_config": "core",
    "types": "core",
    "_checks": "core",
    "_enums": "core",
    "_warnings": "core",
    "_seams": "core",
}
ROWS_ONLY = {"checkpoint", "metrics", "replication"}
SERVING = {"inference"}
# What a serving package may import: whole packages (and top-level modules)
# without a training side, and the reader modules of the others.
SERVING_IMPORTS = {
    "core",
    "io",
    "table",
    "embedding.initializer",
    "checkpoint.layout",
    "checkpoint.files",
    "checkpoint.read",
    "replication.delta",
    "replication.follow",
    "replication.stream_files",
}

# Rule 9's exceptions: other projects' private names, (module, expression) ->
# why there is no public way.
FOREIGN_PRIVATE = {
    ("dynamicemb/storage/padded.py", "torch._check"): (
        "torch's own statement of a symbolic size's bounds for torch.compile, documented "
        "under that name"
    ),
    ("dynamicemb/shard/batch_checks.py", "features._length_per_key"): (
        "TorchRec's KeyedJaggedTensor caches its lengths per key there and has no setter; "
        "the batch check hands it the lengths it read, sparing its split a second read"
    ),
    ("dynamicemb/shard/embedding.py", "self._TORCHREC_CLASS._pre_load_state_dict_hook"): (
        "the sharded module's override of TorchRec's load hook calls the hook of the "
        "TorchRec class it extends"
    ),
    ("dynamicemb/shard/lookup.py", "module._lookups"): (
        "TorchRec's sharded modules keep their lookups there, with no public accessor"
    ),
    ("dynamicemb/shard/tables.py", "module._env"): (
        "TorchRec's sharded modules keep their ShardingEnv (world size, rank, process "
        "group) there, with no public accessor"
    ),
    ("dynamicemb/checkpoint/model_state.py", "module._env"): (
        "TorchRec's sharded modules keep their ShardingEnv (its process group) there, with "
        "no public accessor"
    ),
    ("dynamicemb/io/comm.py", "dist.distributed_c10d._get_process_group_store"): (
        "torch.distributed gives a process group's store only through this function; "
        "without it (another torch) the group is used without its store"
    ),
    (
        "dynamicemb/inference/formats.py",
        "torch._C._dispatch_has_kernel_for_dispatch_key",
    ): (
        "torch's dispatcher says whether an op has a kernel of its own for a device type "
        "only there (torch.library.get_kernel also counts fallbacks and raises)"
    ),
    ("dynamicemb/inference/state.py", "torch._dynamo"): (
        "maybe_mark_dynamic, torch.compile's documented way to keep a size unspecialized, "
        "is torch._dynamo's; torch.compiler has no public alias"
    ),
}
_ATTR_CALLS = ("getattr", "setattr", "hasattr", "delattr")


def _private_name(name: str) -> bool:
    """A private name (``_x``), not a dunder (no one's private attribute)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(owner: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    if isinstance(owner, ast.Name):
        return owner.id in ("self", "cls")
    return (
        isinstance(owner, ast.Call)
        and isinstance(owner.func, ast.Name)
        and owner.func.id == "super"
    )


TRAINING_MODULE = "BatchedDynamicEmbeddingTablesV2"


def package_of(parts: list[str]) -> str:
    """The package of a source file, by its path inside dynamicemb
    (``["table", "keys"]``: table; ``["types"]``: core)."""
    return parts[0] if len(parts) > 1 else TOP_LEVEL.get(parts[0], "root")


def imports(path: pathlib.Path, parts: list[str]):
    """(line, imported dynamicemb module path, names) of every import."""
    tree = ast.parse(path.read_text(), str(path))
    here = parts[:-1]  # the package a relative import starts from
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
        ):
            yield node.lineno, ["<importlib>"], [ast.unparse(node.args[0]) if node.args else ""]
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "dynamicemb":
                    yield node.lineno, a.name.split(".")[1:], []
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                mod = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "dynamicemb":
                mod = node.module.split(".")[1:]
            else:
                continue
            if not mod:  # from dynamicemb import x: a submodule, or a root name
                for n in names:
                    yield node.lineno, [n], [n]
            else:
                yield node.lineno, mod, names


def private_reads(path: pathlib.Path, rel: str, used: set) -> list[str]:
    """Rule 9: ``x._name`` of an object ``x`` other than ``self``, ``cls`` or
    ``super()``, outside ``FOREIGN_PRIVATE`` (the exceptions met are added to
    ``used``)."""
    errors = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            owner, name = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTR_CALLS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            owner, name = node.args[0], node.args[1].value
        else:
            continue
        if not _private_name(name) or _own(owner):
            continue
        expr = f"{ast.unparse(owner)}.{name}"
        if (rel, expr) in FOREIGN_PRIVATE:
            used.add((rel, expr))
            continue
        if any(r == rel and e.startswith(expr + ".") for r, e in FOREIGN_PRIVATE):
            continue  # the owner of a listed name (``torch._C`` of ``torch._C._x``)
        errors.append(
            f"{rel}:{node.lineno}: reads {expr}, a private attribute of another object: "
            "give its owner a public method or property"
        )
    return errors


def build_deps(pkg_dir: pathlib.Path) -> set[str] | None:
    build = pkg_dir / "BUILD.bazel"
    if not build.is_file():
        return None
    deps = set()
    for label in re.findall(r'"//dynamicemb([:/][\w/:.]*)?"', build.read_text()):
        if label in ("", None):
            deps.add("root")
        elif label.startswith(":"):
            deps.add("core" if label == ":core" else label[1:])
        else:
            deps.add(label[1:].split(":")[0].split("/")[0])
    return deps


def check(root: pathlib.Path) -> list[str]:
    errors = []
    for path in sorted((root / "examples").glob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_EXAMPLE_LINES:
            rel = path.relative_to(root).as_posix()
            errors.append(f"{rel}: {lines} lines, more than {MAX_EXAMPLE_LINES}: split it")
    pkg_root = root / "dynamicemb"
    subpackages = {p.name for p in pkg_root.iterdir() if (p / "__init__.py").is_file()}
    foreign_used: set = set()
    for path in sorted(pkg_root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = list(path.relative_to(pkg_root).with_suffix("").parts)
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and rel not in LONG_MODULES:
            errors.append(f"{rel}: {lines} lines, more than {MAX_LINES}: split it")
        errors += private_reads(path, rel, foreign_used)
        pkg = package_of(parts)
        deps = build_deps(pkg_root / pkg) if pkg in subpackages else None
        for line, mod, names in imports(path, parts):
            where = f"{rel}:{line}"
            if not mod:
                continue
            if mod == ["<importlib>"]:
                errors.append(f"{where}: imports {names[0]} by name: write an import statement")
                continue
            if mod[0] == "_C" or "_native" in mod:
                if pkg != "table":
                    errors.append(
                        f"{where}: imports the native extension; go through dynamicemb.table"
                    )
                continue
            if mod[0] in subpackages:
                target = mod[0]
            else:  # a top-level module, or a name of dynamicemb/__init__.py
                target = TOP_LEVEL.get(mod[0], "root")
            if pkg in ROWS_ONLY and (TRAINING_MODULE in names or target == "embedding"):
                errors.append(
                    f"{where}: {pkg} reaches rows through dynamicemb.storage's TableRows, "
                    f"never through dynamicemb.embedding or {TRAINING_MODULE}"
                )
            if (
                pkg in SERVING
                and target != pkg
                and target not in SERVING_IMPORTS
                and ".".join(mod[:2]) not in SERVING_IMPORTS
            ):
                errors.append(
                    f"{where}: {pkg} serves without the training code; it imports "
                    f"{'.'.join(mod)}, which is not one of {sorted(SERVING_IMPORTS)}"
                )
            if target == pkg:
                continue
            if LAYERS[target] >= LAYERS[pkg]:
                errors.append(
                    f"{where}: {pkg} (layer {LAYERS[pkg]}) imports {'.'.join(mod)} of {target} "
                    f"(layer {LAYERS[target]}): a layer imports only the ones below it"
                )
            if deps is not None and target not in deps:
                dep = "//dynamicemb:core" if target == "core" else f"//dynamicemb/{target}"
                errors.append(
                    f"{where}: imports {'.'.join(mod)}, but {pkg}/BUILD.bazel does not depend "
                    f"on {dep}"
                )
    for rel, expr in sorted(set(FOREIGN_PRIVATE) - foreign_used):
        errors.append(f"{rel}: FOREIGN_PRIVATE lists {expr}, which it no longer reads")
    return errors + check_test_deps(root) + check_test_targets(root)


# Test packages any test may import without a BUILD dependency (plain modules
# of tests/, in every test target's srcs).
TEST_SHARED = {"devices", "conftest"}


def check_test_deps(root: pathlib.Path) -> list[str]:
    """Rule 7: ``tests.<other>`` imports against the ``//tests/<other>`` labels."""
    errors = []
    tests = root / "tests"
    for build in sorted(tests.glob("*/BUILD.bazel")):
        pkg = build.parent.name
        text = build.read_text()
        labels = set(re.findall(r'"//tests/(\w+)[:"]', text))
        whole = '"//dynamicemb"' in text
        for path in sorted(build.parent.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    mods = [node.module]
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                else:
                    continue
                if isinstance(node, ast.ImportFrom) and node.module == "dynamicemb":
                    mods = mods + [f"dynamicemb.{a.name}" for a in node.names]
                for mod in mods:
                    if mod == "dynamicemb.incremental_dump" and not whole:
                        errors.append(
                            f"{path.relative_to(root).as_posix()}:{node.lineno}: imports {mod}, "
                            f"but tests/{pkg}/BUILD.bazel does not depend on //dynamicemb"
                        )
                        continue
                    parts = mod.split(".")
                    if parts[0] != "tests" or len(parts) < 2:
                        continue
                    other = parts[1]
                    if other in (pkg, *TEST_SHARED) or other in labels:
                        continue
                    errors.append(
                        f"{path.relative_to(root).as_posix()}:{node.lineno}: imports {mod}, but "
                        f"tests/{pkg}/BUILD.bazel does not depend on //tests/{other}"
                    )
    return errors


def pytest_targets(text: str) -> list[list[str] | None]:
    """The ``srcs`` of each ``pytest_test`` call of a BUILD file (None: none
    given, the package's every file)."""
    targets = []
    for m in re.finditer(r"\bpytest_test\(", text):
        depth, end = 1, m.end()
        while depth and end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        srcs = re.search(r"\bsrcs\s*=\s*\[(.*?)\]", text[m.end() : end], re.S)
        targets.append(re.findall(r'"([^"]+)"', srcs.group(1)) if srcs else None)
    return targets


def check_test_targets(root: pathlib.Path) -> list[str]:
    """Rule 8: every test file of a test package in one of its pytest_test targets."""
    errors = []
    for build in sorted((root / "tests").glob("**/BUILD.bazel")):
        pkg = build.parent
        targets = pytest_targets(build.read_text())
        if None in targets:
            continue
        listed = {f for srcs in targets for f in srcs}
        for path in sorted(pkg.rglob("*.py")):
            rel = path.relative_to(pkg)
            if any((pkg / d / "BUILD.bazel").is_file() for d in rel.parents if d.parts):
                continue  # another package's
            if not (rel.name.startswith("test_") or rel.name.endswith("_test.py")):
                continue
            if rel.as_posix() not in listed:
                errors.append(
                    f"{path.relative_to(root).as_posix()}: in no pytest_test of "
                    f"{build.relative_to(root).as_posix()}: bazel test never runs it"
                )
    return errors


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    errors = check(root.resolve())
    for e in errors:
        print(f"check_layers: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
