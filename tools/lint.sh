#!/usr/bin/env bash
# The lint gate: ruff (lint and format) for Python, clang-format for C++/CUDA,
# buildifier for BUILD/.bzl files (and that C++/CUDA rules come from //bazel:defs.bzl),
# the package's layering (tools/check_layers.py) and the torch ops' kernels and opcheck
# tests (tools/check_ops.py).
# .ci/run runs it before the tests; alone it takes seconds once tools/setup_env.sh has
# installed the tools.
#
#   bash tools/lint.sh          check; exits non-zero on any finding
#   bash tools/lint.sh --fix    rewrite the files in place (format + safe lint fixes)
#
# Configuration: pyproject.toml ([tool.ruff]), .clang-format. The stand-ins under
# third_party/offline forward to Bazel's native rules by design, so buildifier checks
# only their format there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${VENV:-$PWD/.venv}
RUFF=$VENV/bin/ruff
CLANG_FORMAT=$VENV/bin/clang-format
BUILDIFIER=$VENV/lint/node_modules/@bazel/buildifier/buildifier-linux_amd64
for tool in "$RUFF" "$CLANG_FORMAT" "$BUILDIFIER"; do
  if [ ! -x "$tool" ]; then
    echo "lint: $tool is missing; run tools/setup_env.sh first" >&2
    exit 2
  fi
done

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: tools/lint.sh [--fix]" >&2; exit 2 ;;
esac

# Tracked and new (not ignored) files only: never .venv, bazel-* or build outputs.
files() { git ls-files --cached --others --exclude-standard -- "$@"; }
mapfile -t cxx < <(files '*.h' '*.cc' '*.cpp' '*.cu' '*.cuh')
mapfile -t bzl_ours < <(files 'BUILD' '*BUILD.bazel' '*.bzl' 'WORKSPACE' 'MODULE.bazel' | grep -v '^third_party/offline/' || true)
mapfile -t bzl_offline < <(files 'third_party/offline/*' | grep -E '(BUILD|BUILD\.bazel|\.bzl)$' || true)

status=0
run() {
  if ! "$@"; then status=1; fi
}
# refuse WHAT [FILE...]: the gate fails naming the files, when there are any.
refuse() {
  local what=$1
  shift
  if (($#)); then
    echo "lint: $what: $*" >&2
    status=1
  fi
}
if ((fix)); then
  "$RUFF" check --fix -q .
  "$RUFF" format -q .
  "$CLANG_FORMAT" -i "${cxx[@]}"
  "$BUILDIFIER" -mode=fix -lint=fix "${bzl_ours[@]}"
  "$BUILDIFIER" -mode=fix "${bzl_offline[@]}"
fi
run "$RUFF" check -q .
run "$RUFF" format --check -q .
run "$CLANG_FORMAT" --dry-run -Werror "${cxx[@]}"
run "$BUILDIFIER" -mode=check -lint=warn "${bzl_ours[@]}"
run "$BUILDIFIER" -mode=check "${bzl_offline[@]}"
# dynamicemb's C++ and CUDA targets take their rules from //bazel:defs.bzl, which adds
# the C++ standard and CUDA archs the code needs wherever it is built (docs/building.md);
# only //bazel itself and the example of another workspace load the rule sets directly.
direct_rules() {
  grep -lE 'load\("@rules_(cc//cc|cuda//cuda):defs\.bzl"' "${bzl_ours[@]}" |
    grep -vE '^(bazel|examples)/' || true
}
# The CPU build's sources include ATen/core/Tensor.h and the per-operator headers
# (ATen/ops/<op>.h) they use: <ATen/ATen.h> declares every operator and
# <torch/extension.h> all of libtorch's C++ API: with them the extension's CPU compiles
# took 112 s, 77 s without (module.cpp 24.6 s -> 9.8; CI builds the extension three
# times). The CUDA-only files (*_cuda.cpp, *.cu, cuda_scratch.h) are built only where a
# GPU build is made.
whole_aten() {
  grep -lE '#include <(ATen/ATen\.h|torch/extension\.h)>' "${cxx[@]}" |
    grep -vE '(_cuda\.cpp|\.cuh?|cuda_scratch\.h)$' || true
}
mapfile -t direct < <(direct_rules)
refuse "load cc_* and cuda_library from //bazel:defs.bzl, not @rules_cc or @rules_cuda" \
  "${direct[@]}"
mapfile -t whole < <(whole_aten)
refuse "include ATen/core/Tensor.h and ATen/ops/<op>.h, not ATen/ATen.h or torch/extension.h" \
  "${whole[@]}"
# The package's structure: layers, Bazel deps, the one door to the extension,
# module length (tools/check_layers.py says which rules).
run "$VENV/bin/python" tools/check_layers.py
# The torch ops: a kernel on every backend, and opcheck on each (tools/check_ops.py).
run "$VENV/bin/python" tools/check_ops.py
# MODULE.bazel and WORKSPACE provide the same repositories (tools/check_bzlmod.py).
run "$VENV/bin/python" tools/check_bzlmod.py
if ((status)); then
  echo "lint: FAILED (bash tools/lint.sh --fix rewrites what can be fixed automatically)" >&2
else
  echo "lint: ok (${#cxx[@]} C++/CUDA, ${#bzl_ours[@]}+${#bzl_offline[@]} Bazel files; Python by ruff)"
fi
exit "$status"
