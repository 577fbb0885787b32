#!/usr/bin/env bash
# The project's test command, as given in README.md; .ci/run calls it too.
# Installs what is missing (tools/setup_env.sh), runs the lint gate (tools/lint.sh), then
# builds and runs every test with Debian's Bazel 4. Extra arguments go to `bazel test` (e.g. --test_output=all).
# Beside it, at the lowest priority (they take the cores the tests leave idle), and with
# their output after the tests':
#   * the same checkout as an external repository of examples/bazel_consumer: its tests
#     and the build settings of dynamicemb's targets there (examples/bazel_consumer/test.sh;
#     at an equal share, not the lowest: below);
#   * tools/check_dist.py --fresh-venv: the sdist and the wheel built once, what they
#     carry and declare, the wheel installed with its extras into a fresh venv and
#     running examples/quickstart.py there (under a minute: the wheel carries the
#     extension Bazel built for the tests, //dynamicemb:_C.so, built first for it;
#     setup.py's own compile is what tools/run_gpu_tests.sh runs);
#   * the newest tested torch / torchrec / FBGEMM set on a handful of the Python suite
#     (tools/newest_smoke.sh: a venv of its own, the extension built for that torch).
# The last two are not run again for the same files and venvs once they have passed
# (.cache/<name> holds what each passed for; remove it to run it anyway).
# The API reference is built (Sphinx, warnings as errors) by //tests/docs.
# Ends with one line "bazel: N passed, N failed" (test targets of both workspaces).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log=$(mktemp)
consumer_log=$(mktemp)
dist_log=$(mktemp)
newest_log=$(mktemp)
extension=$(mktemp --suffix=.so)
sessions=$(mktemp -d)
pids=()
# The background sessions (low, below) get no Ctrl-C of their own: each is ended here.
end_sessions() {
  local f
  for f in "$sessions"/*; do
    [ -f "$f" ] && kill -- "-$(cat "$f")" 2>/dev/null || true
  done
}
trap 'end_sessions; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$log" "$consumer_log" "$dist_log" "$newest_log" "$extension" "$sessions"' EXIT
rc=0

# What the packaging check and the newest-set smoke test depend on: the files they
# copy (tracked and new, not ignored; tools/setup_env.sh and tools/newest_smoke.sh pin
# their venvs' sets) and the interpreter that makes the venvs.
inputs_key() {
  {
    git ls-files -z --cached --others --exclude-standard | xargs -0 sha256sum 2>/dev/null || true
    "${PYTHON:-python3}" -VV
  } | sha256sum | cut -d' ' -f1
}
key=$(inputs_key)

# low CMD...: runs CMD at the lowest priority. Linux shares the cores between sessions
# (autogroups) equally, whatever the nice of their processes, and a Bazel server is a
# session of its own: CMD gets a session whose group's nice is 19, so it takes the cores
# that the tests (the Bazel server's group) leave idle.
low() {
  setsid -w bash -c 'echo $$ >"$0"; echo 19 >/proc/self/autogroup 2>/dev/null || true
    exec nice -n 19 "$@"' "$(mktemp -p "$sessions")" "$@"
}

# once NAME LOG CMD...: runs CMD in the background at the lowest priority, its output to
# LOG, unless it passed for these inputs already (.cache/NAME holds the key it passed for).
once() {
  local name=$1 out=$2 stamp=.cache/$1
  shift 2
  if [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
    echo "$name: passed for these files and venvs already ($stamp)" >"$out"
    return
  fi
  (
    low "$@"
    mkdir -p .cache
    echo "$key" >"$stamp"
  ) >"$out" 2>&1 &
  pids+=("$!")
}
# The newest-set smoke needs neither the apt packages nor the checkout's venv (a venv of
# its own, pip and the C++ compiler): it starts first, its pip beside setup_env's.
once newest-smoke "$newest_log" bash tools/newest_smoke.sh

bash tools/setup_env.sh
bash tools/lint.sh

# The consumer workspace keeps its Bazel server's equal share: its tests have Bazel's
# timeouts (60 s for a small one), which a starved group's can exceed.
bash examples/bazel_consumer/test.sh "$@" >"$consumer_log" 2>&1 &
pids+=("$!")

# The extension first (most tests need it anyway), then the packaging check on a copy
# of it beside the tests.
if bazel build //dynamicemb:_C.so 2>&1 | tee "$log"; then
  cp .bazel/bin/dynamicemb/_C.so "$extension"
  once check-dist-fresh-venv "$dist_log" .venv/bin/python tools/check_dist.py --fresh-venv \
    --extension "$extension"
else
  rc=1
fi

bazel test //... "$@" 2>&1 | tee -a "$log" || rc=$?
for p in "${pids[@]}"; do
  wait "$p" || rc=$?
done
pids=()
cat "$consumer_log" "$dist_log" "$newest_log"
cat "$consumer_log" >>"$log"
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE)' "$log" || true)
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed
fi
echo "bazel: $passed passed, $failed failed"
exit "$rc"
