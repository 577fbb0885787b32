"""The checkout's files, found from the test's working directory (the
runfiles root under Bazel) or from this file (pytest in the tree)."""

import importlib.util
import shutil
from pathlib import Path


def repo_root() -> Path:
    for root in (Path.cwd(), Path(__file__).parents[2]):
        if (root / "MODULE.bazel").is_file() and (root / "setup.py").is_file():
            return root
    raise FileNotFoundError("MODULE.bazel and setup.py")


def tool(name: str):
    """tools/<name>.py, loaded as a module (its main() not run)."""
    path = repo_root() / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setup_py_names() -> dict:
    """setup.py's names (TESTED_WITH, extras, ...), without running setup()."""
    path = repo_root() / "setup.py"
    names = {"__name__": "setup_py", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), names)
    return names


def checkout_with_extension(at: Path) -> Path:
    """A checkout at `at` with the extension built in place, as README.md's
    commands leave one: the examples' scripts copied, the package the tests
    import (the one with the extension beside it) linked. Python resolves the
    links of a script's folder, so under Bazel the runfiles' examples would
    find the source tree's dynamicemb, which has no extension."""
    import dynamicemb

    (at / "examples").mkdir(parents=True)
    for script in (repo_root() / "examples").glob("*.py"):
        shutil.copy(script, at / "examples")
    (at / "dynamicemb").symlink_to(Path(dynamicemb.__file__).parent, target_is_directory=True)
    return at
