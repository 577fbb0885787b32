"""The checkout's files, found from the test's working directory (the
runfiles root under Bazel) or from this file (pytest in the tree)."""

from pathlib import Path


def repo_root() -> Path:
    for root in (Path.cwd(), Path(__file__).parents[2]):
        if (root / "MODULE.bazel").is_file() and (root / "setup.py").is_file():
            return root
    raise FileNotFoundError("MODULE.bazel and setup.py")


def setup_py_names() -> dict:
    """setup.py's names (TESTED_WITH, extras, ...), without running setup()."""
    path = repo_root() / "setup.py"
    names = {"__name__": "setup_py", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), names)
    return names
