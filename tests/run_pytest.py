"""Runs pytest on the test files named on the command line; exits with pytest's code.

Used as the main of every pytest_test (tools/pytest.bzl). Runs from the Bazel runfiles
tree, where the paths are relative to the workspace root. Also usable by hand:
    python tests/run_pytest.py tests/config/test_config.py
"""

import os
import sys


def main(argv):
    files = [a for a in argv if a.endswith(".py")]
    if not files:
        print("run_pytest: no test files given", file=sys.stderr)
        return 1

    # Runfiles are read-only symlinks: no cache, no bytecode written next to them.
    sys.dont_write_bytecode = True
    import pytest

    args = ["-p", "no:cacheprovider", "-rs", "--rootdir", os.getcwd()]
    if os.path.exists("pyproject.toml"):
        args += ["-c", "pyproject.toml"]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    only = os.environ.get("TESTBRIDGE_TEST_ONLY")  # bazel test --test_filter=...
    if only:
        args += ["-k", only]

    code = int(pytest.main(args + argv))
    if code == int(pytest.ExitCode.NO_TESTS_COLLECTED):
        print("run_pytest: no tests were collected from %s" % " ".join(files), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
