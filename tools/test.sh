#!/usr/bin/env bash
# The project's test command, as given in README.md; .ci/run calls it too.
# Installs what is missing (tools/setup_env.sh), runs the lint gate (tools/lint.sh), then
# builds and runs every test with Debian's Bazel 4. Extra arguments go to `bazel test` (e.g. --test_output=all).
# Beside it, at a lower priority (they take the cores the tests leave idle), and with
# their output after the tests':
#   * the same checkout as an external repository of examples/bazel_consumer: its tests
#     and the build settings of dynamicemb's targets there (examples/bazel_consumer/test.sh);
#   * tools/check_dist.py --fresh-venv: the sdist and the wheel built once, what they
#     carry and declare, the wheel installed with its extras into a fresh venv and
#     running examples/quickstart.py there (it compiles the extension and installs:
#     minutes). It is not run again for the same files and venv once it has passed
#     (.cache/check-dist-fresh-venv holds what it passed for; remove it to run it anyway).
# The API reference is built (Sphinx, warnings as errors) by //tests/docs.
# Ends with one line "bazel: N passed, N failed" (test targets of both workspaces).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup_env.sh
bash tools/lint.sh
log=$(mktemp)
consumer_log=$(mktemp)
dist_log=$(mktemp)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -f "$log" "$consumer_log" "$dist_log"' EXIT
rc=0

# What the packaging check depends on: the files it copies (tracked and new, not
# ignored), the venv's set-up and its interpreter.
dist_inputs() {
  git ls-files -z --cached --others --exclude-standard | xargs -0 sha256sum 2>/dev/null || true
  cat .venv/.dynamicemb-setup 2>/dev/null || true
  .venv/bin/python -VV
}
dist_stamp=.cache/check-dist-fresh-venv
dist_key=$(dist_inputs | sha256sum | cut -d' ' -f1)
if [ "$(cat "$dist_stamp" 2>/dev/null)" = "$dist_key" ]; then
  echo "check_dist: --fresh-venv passed for these files and this venv already ($dist_stamp)" >"$dist_log"
else
  (
    nice -n 10 .venv/bin/python tools/check_dist.py --fresh-venv
    mkdir -p "$(dirname "$dist_stamp")"
    echo "$dist_key" >"$dist_stamp"
  ) >"$dist_log" 2>&1 &
  pids+=("$!")
fi
nice -n 10 bash examples/bazel_consumer/test.sh "$@" >"$consumer_log" 2>&1 &
pids+=("$!")

bazel test //... "$@" 2>&1 | tee "$log" || rc=$?
for p in "${pids[@]}"; do
  wait "$p" || rc=$?
done
pids=()
cat "$consumer_log" "$dist_log"
cat "$consumer_log" >>"$log"
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed
fi
echo "bazel: $passed passed, $failed failed"
exit "$rc"
