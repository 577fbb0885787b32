#!/bin/bash
# Runs every GPU-marked test on a CUDA machine without Bazel.
#
#   bash tools/run_gpu_tests.sh [extra pytest args]
#
# Builds dynamicemb._C in place with the machine's own torch and nvcc (the
# non-Bazel build path: setup.py, sources from cc/sources.bzl), then runs
# `pytest -m gpu` over tests/ and ends with one line "N passed, N failed".
# Environment: PY (interpreter, default python3), DEMB_CUDA_ARCHS (default 90),
# MAX_JOBS. If a torchrec/fbgemm bundle sits in .gpupkg/ (see docs/testing.md),
# it is put on PYTHONPATH first.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [ -f .gpupkg/bin/remote_setup.sh ]; then
  # shellcheck disable=SC1091
  source .gpupkg/bin/remote_setup.sh
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DEMB_CUDA_ARCHS=${DEMB_CUDA_ARCHS:-90} DEMB_BUILD_CUDA=1 MAX_JOBS=${MAX_JOBS:-16}
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no device')"
start=$(date +%s)
if ! "$PY" setup.py -q build_ext --inplace > .gpu_build.log 2>&1; then
  tail -50 .gpu_build.log
  echo "build failed"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "built dynamicemb._C in $(( $(date +%s) - start )) s"
report=$(mktemp)
"$PY" -m pytest -m gpu tests -q -p no:cacheprovider --junitxml="$report" "$@"
rc=$?
"$PY" - "$report" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(f"{tests - failed - skipped} passed, {failed} failed, {skipped} skipped")
PYEOF
exit $rc
