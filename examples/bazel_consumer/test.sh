#!/usr/bin/env bash
# Builds and tests this workspace, which depends on the dynamicemb checkout two levels
# up (WORKSPACE): each public Python target imports the module docs/building.md names
# for it (import_*), then checks from here that `bazel query @dynamicemb//...` lists its
# targets and what dynamicemb's targets compile with: C++20, device code for the archs
# of cc/sources.bzl, the static cudart. The CUDA checks read
# the planned command lines (bazel aquery/cquery): nothing is compiled for them.
# tools/test.sh (and so .ci/run) runs it beside dynamicemb's own tests.
#
# The interpreter is $PYTHON_BIN_PATH, by default the checkout's .venv. Extra arguments
# go to `bazel test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT=$(cd ../.. && pwd)
# The interpreter as docs/building.md (".bazelrc") says to give it, one line per
# command that loads the repositories, in python.bazelrc (imported by .bazelrc): the
# build and test, and the query below, run with no flag of their own.
python=${PYTHON_BIN_PATH:-$ROOT/.venv/bin/python}
printf '%s --repo_env=PYTHON_BIN_PATH=%s\n' build "$python" query "$python" fetch "$python" \
  >python.bazelrc

status=0
# The import tests stand for docs/building.md's list of public targets.
"$python" documented_targets.py || status=1
bazel test --test_output=errors //... "$@" || status=$?

fail() {
  echo "bazel_consumer: $*" >&2
  status=1
}

# dynamicemb's targets as a query sees them from here (the checkout's own output links
# are .bazelignore'd, so the query does not walk into them).
targets=$(bazel query '@dynamicemb//...' 2>/dev/null) || fail "bazel query @dynamicemb//... failed"
for want in @dynamicemb//dynamicemb/embedding:embedding @dynamicemb//cc/table:table_cpu; do
  grep -qxF "$want" <<<"$targets" || fail "bazel query @dynamicemb//... lacks $want"
done
archs=$(sed -n 's/^CUDA_ARCHS = \[\(.*\)\]/\1/p' "$ROOT/cc/sources.bzl" | tr -d '", ' | fold -w2)
[ -n "$archs" ] || fail "no CUDA_ARCHS in cc/sources.bzl"

# Every nvcc command of the table's CUDA library: C++20 and each arch's SASS.
nvcc=$(bazel aquery --output=text \
  'mnemonic("NvccCompile", deps(@dynamicemb//cc/table:table_cuda))' 2>/dev/null |
  grep -v '^ *Inputs:')
actions=$(grep -c 'Mnemonic: NvccCompile' <<<"$nvcc" || true)
[ "$actions" -gt 0 ] || fail "no nvcc command for @dynamicemb//cc/table:table_cuda"
for want in -std=c++20 $(for a in $archs; do echo "-gencode=arch=compute_$a,code=sm_$a"; done); do
  got=$(grep -cF -- "$want" <<<"$nvcc" || true)
  [ "$got" -eq "$actions" ] || fail "$want in $got of $actions nvcc commands"
done

# The C++ compiles: the last -std of each command is C++20.
stds=$(bazel aquery --output=text \
  'mnemonic("CppCompile", @dynamicemb//cc/table:table_cpu)' 2>/dev/null |
  grep -v '^ *Inputs:' | grep -oE "^ *'?-std=[^' ]*|Mnemonic: CppCompile" | tr -d " '" |
  awk '/^Mnemonic/ { if (last) print last; last = "" } /^-std/ { last = $0 } END { print last }')
[ -n "$stds" ] && ! grep -qv '^-std=c++20$' <<<"$stds" ||
  fail "C++ compiles of @dynamicemb//cc/table:table_cpu end with: $(echo $stds)"

# The CUDA runtime linked with the table's CUDA library: the static cudart only.
runtime=$(bazel cquery 'deps(@dynamicemb//cc/table:table_cuda)' 2>/dev/null |
  grep -oE 'libcudart[^ ]*' | sort -u)
[ "$runtime" = "libcudart_static.a" ] || fail "cudart linked: $(echo $runtime)"

if [ "$status" -eq 0 ]; then
  echo "bazel_consumer: tests passed; @dynamicemb//... queried; C++20, archs $(echo $archs), static cudart"
fi
exit "$status"
