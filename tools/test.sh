#!/usr/bin/env bash
# The project's test command, as given in README.md; .ci/run calls it too.
# Installs what is missing (tools/setup_env.sh), runs the lint gate (tools/lint.sh), then
# builds and runs every test with Debian's Bazel 4. Extra arguments go to `bazel test` (e.g. --test_output=all).
# Then the same checkout as an external repository of examples/bazel_consumer: its tests
# and the build settings of dynamicemb's targets there (examples/bazel_consumer/test.sh).
# Last, tools/check_dist.py: what the sdist and the wheel would carry and declare, then
# the wheel built, installed with its extras into a fresh venv and running
# examples/quickstart.py there (--fresh-venv: compiles the extension, a few minutes).
# The API reference is built (Sphinx, warnings as errors) by //tests/docs.
# Then the newest tested torch / torchrec / FBGEMM set on a handful of the Python suite
# (tools/newest_smoke.sh: a venv of its own, the extension built for that torch).
# Ends with one line "bazel: N passed, N failed" (test targets of both workspaces).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup_env.sh
bash tools/lint.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
bazel test //... "$@" 2>&1 | tee "$log" || rc=$?
bash examples/bazel_consumer/test.sh "$@" 2>&1 | tee -a "$log" || rc=$?
.venv/bin/python tools/check_dist.py || rc=$?
.venv/bin/python tools/check_dist.py --fresh-venv || rc=$?
bash tools/newest_smoke.sh || rc=$?
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed
fi
echo "bazel: $passed passed, $failed failed"
exit "$rc"
