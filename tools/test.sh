#!/usr/bin/env bash
# The project's test command, as given in README.md; .ci/run calls it too.
# Installs what is missing (tools/setup_env.sh), then builds and runs every test with
# Debian's Bazel 4. Extra arguments go to `bazel test` (e.g. --test_output=all).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup_env.sh && bazel test //... "$@"
