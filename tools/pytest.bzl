"""pytest_test: one py_test that runs pytest over the test files of a package.

    load("//tools:pytest.bzl", "pytest_test")
    pytest_test(name = "config_test", deps = ["//dynamicemb"])

By default the sources are every .py file of the package (subdirectories without a BUILD
file included); test files are test_*.py and *_test.py. The runner, //tests:run_pytest.py,
passes exactly those files to pytest and exits with pytest's code, so a suite that
collects nothing (pytest exit code 5) fails.
"""

load("@rules_python//python:defs.bzl", "py_test")

def _is_test_file(path):
    base = path.split("/")[-1]
    return base.endswith(".py") and (base.startswith("test_") or base.endswith("_test.py"))

def pytest_test(name, srcs = None, deps = [], data = [], args = [], size = "medium", allow_no_tests = False, **kwargs):
    """Defines a py_test running pytest on this package's test files.

    Args:
      name: target name.
      srcs: Python files of the suite; default: glob(["**/*.py"]).
      deps: py_library targets the tests import (e.g. //dynamicemb).
      data: extra runtime files.
      args: extra pytest arguments, placed before the test files.
      size: test size (default "medium": 5 minutes).
      allow_no_tests: if True and there is no test file, define nothing (instead of a
        test that fails).
      **kwargs: passed to py_test (tags, timeout, flaky, ...).
    """
    if srcs == None:
        srcs = native.glob(["**/*.py"], allow_empty = True)
    pkg = native.package_name()
    test_files = [pkg + "/" + s for s in srcs if _is_test_file(s)]
    if not test_files and allow_no_tests:
        return
    py_test(
        name = name,
        size = size,
        srcs = ["//tests:run_pytest.py"] + srcs,
        main = "//tests:run_pytest.py",
        args = args + test_files,
        data = data + ["//:pyproject.toml"],
        # Test directories are not packages: pytest imports test files by path.
        legacy_create_init = False,
        python_version = "PY3",
        deps = deps + ["//tests:test_support"],
        **kwargs
    )
