#!/usr/bin/env bash
# The newest tested set of torch, torchrec and FBGEMM (the last entry of TESTED_WITH in
# setup.py) on a handful of the Python suite, on the CPU: a venv of its own
# ($VENV_NEWEST, default .venv-newest), the extension built for that torch in a copy of
# the checkout's files (tracked and new, not ignored), and the tests run in that copy.
# tools/test.sh runs it beside the pinned set's suite; a few minutes once the venv exists
# (the first run installs torch and compiles the extension).
#
#     bash tools/newest_smoke.sh                # the default files
#     bash tools/newest_smoke.sh tests/x.py     # other test files
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV_NEWEST:-$ROOT/.venv-newest}
PYTHON=${PYTHON:-python3}
log() { echo "newest_smoke: $*" >&2; }

# The newest set; tests/packaging checks that it is TESTED_WITH's last pair.
TORCH=torch==2.14.1
FBGEMM=fbgemm-gpu-cpu==1.9.0
TORCHREC=torchrec==1.9.2
REQS=(tensordict==0.15.3 torchmetrics==1.0.3 tqdm==4.70.1 pyre-extensions==0.0.32
  numpy pytest hypothesis numba ninja "setuptools>=77" opentelemetry-api)
FILES=(
  tests/table/test_table_ops.py
  tests/embedding/test_batched_tables.py
  tests/embedding/test_insert_failures.py
  tests/planner/test_quiet.py
  tests/shard/test_fused_params.py
  tests/packaging/test_quickstart.py
  tests/main_job/test_exit.py
)
if (($#)); then FILES=("$@"); fi

STAMP_CONTENT="$TORCH $FBGEMM $TORCHREC ${REQS[*]}"
STAMP=$VENV/.dynamicemb-newest
PY=$VENV/bin/python
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$STAMP_CONTENT" ]; then
  [ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
  log "pip: $TORCH $FBGEMM and torchrec's requirements"
  # --no-compile: the modules the smoke imports are compiled when first imported, not
  # every module of torch's CUDA wheel and its CUDA libraries at install.
  "$PY" -m pip install -q --no-compile "$TORCH" "$FBGEMM" "${REQS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  log "pip: $TORCHREC (--no-deps: its metadata asks for the CUDA fbgemm-gpu)"
  "$PY" -m pip install -q --no-compile --no-deps "$TORCHREC" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  echo "$STAMP_CONTENT" > "$STAMP"
fi
"$PY" -c 'import torch, fbgemm_gpu, torchrec; print("newest_smoke: torch %s, fbgemm_gpu %s, torchrec %s" % (torch.__version__, fbgemm_gpu.__version__, torchrec.__version__))' >&2

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
  grep -zv '^dynamicemb/_C' | xargs -0 cp --parents -t "$WORK")
log "building the extension for this torch (CPU) in $WORK"
(cd "$WORK" && DEMB_BUILD_CUDA=0 "$PY" setup.py -q build_ext --inplace >"$WORK/build.log" 2>&1) ||
  { tail -40 "$WORK/build.log" >&2; exit 1; }
cd "$WORK"
# As .bazelrc sets for the tests: it runs beside them, its OpenMP threads passive.
OMP_WAIT_POLICY=PASSIVE "$PY" -m pytest -q -p no:cacheprovider "${FILES[@]}"
