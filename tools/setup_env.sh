#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test dynamicemb:
#   * apt: Debian's Bazel 4 (bazel-bootstrap), GoogleTest/GMock, Prometheus (the metrics
#     test starts a server of its own);
#   * ./.venv: torch (CPU), fbgemm-gpu-cpu, torchrec, the test tools, Sphinx (the API
#     reference) and the lint tools (ruff and clang-format from PyPI; buildifier from
#     the npm registry into .venv/lint).
# Idempotent and fast when everything is there already (a few seconds).
# The CUDA toolkit (nvcc) is not installed here: it is expected at $CUDA_PATH,
# /usr/local/cuda or on PATH (see docs/building.md).
#
# Environment:
#   PYTHON   interpreter that creates the venv (default: python3)
#   VENV     venv directory (default: <repo>/.venv)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}

log() { echo "setup_env: $*" >&2; }

# ---------------------------------------------------------------- apt packages
APT_PACKAGES=(bazel-bootstrap libgtest-dev libgmock-dev)
# npm fetches buildifier; Debian's npm only where the machine has none of its own.
command -v npm >/dev/null || APT_PACKAGES+=(npm)
# Installed without their recommends: prometheus's would add the node exporter, a
# service of its own.
APT_BARE=(prometheus)

missing=()
missing_bare=()
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${APT_PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${APT_BARE[@]}"; do installed "$p" || missing_bare+=("$p"); done
# apt runs beside pip below (neither needs the other; on a fresh machine each takes
# about a minute); npm waits for it.
apt_install() {
  local SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  log "apt-get install ${missing[*]} ${missing_bare[*]}"
  $SUDO apt-get update -q
  if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
  fi
  if ((${#missing_bare[@]})); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
      "${missing_bare[@]}"
  fi
}
apt_pid=""
if ((${#missing[@]} + ${#missing_bare[@]})); then
  apt_install &
  apt_pid=$!
else
  log "apt packages present"
fi
wait_apt() {
  if [ -n "$apt_pid" ]; then
    wait "$apt_pid"
    apt_pid=""
  fi
}

# ---------------------------------------------------------------- Python venv
# torchrec is installed with --no-deps: its metadata requires `fbgemm-gpu`, the CUDA
# build (hundreds of MB of CUDA wheels). fbgemm-gpu-cpu provides the same module
# `fbgemm_gpu`; torchrec's other requirements are listed here explicitly (pinned as on
# the GPU machine's bundle, see docs/building.md).
TORCH=torch==2.13.0
FBGEMM=fbgemm-gpu-cpu==1.8.0
TORCHREC=torchrec==1.8.0
TORCHREC_REQS=(tensordict==0.15.3 torchmetrics==1.0.3 tqdm==4.70.1 pyre-extensions==0.0.32)
# sphinx builds the API reference (tools/api_docs.py, run by //tests/docs); fsspec and
# s3fs are the object store paths (the "s3" extra), moto's server the S3 endpoint their
# tests start (tests/object_store).
TOOLS=(numpy pytest hypothesis numba opentelemetry-api opentelemetry-sdk
  opentelemetry-exporter-prometheus ninja build==1.6.1 ruff==0.17.6 clang-format==23.1.5
  sphinx==9.0.4 fsspec==2026.9.0 s3fs==2026.9.0 "moto[server]==5.2.5")
BUILDIFIER=@bazel/buildifier@8.2.1

# The stamp records what was installed; when it matches and the imports work, skip pip.
STAMP_CONTENT="$TORCH $FBGEMM $TORCHREC ${TORCHREC_REQS[*]} ${TOOLS[*]} $BUILDIFIER"
STAMP=$VENV/.dynamicemb-setup
CHECK='
import sys
import torch, fbgemm_gpu, torchrec, numpy, pytest, hypothesis, numba, ninja, build, sphinx
import opentelemetry.sdk, opentelemetry.exporter.prometheus
import fsspec, s3fs, moto.server
print("setup_env: torch %s, fbgemm_gpu %s, torchrec %s" % (
    torch.__version__, fbgemm_gpu.__version__, torchrec.__version__), file=sys.stderr)
'

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY=$VENV/bin/python

BUILDIFIER_BIN=$VENV/lint/node_modules/@bazel/buildifier/buildifier-linux_amd64
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_CONTENT" ] && [ -x "$BUILDIFIER_BIN" ] &&
  versions=$("$PY" -c "$CHECK" 2>&1); then
  echo "$versions" >&2
  log "venv up to date ($VENV)"
else
  rm -f "$STAMP"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # (The filter drops pip's notes about index directories that lack a package.)
  pip_install() {
    "$PY" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  }
  log "pip: torch, fbgemm-gpu-cpu, torchrec requirements, tools"
  # torch is pinned in the same call, so the resolver cannot move it.
  pip_install "$TORCH" "$FBGEMM" "${TORCHREC_REQS[@]}" "${TOOLS[@]}"
  log "pip: torchrec (--no-deps)"
  pip_install --no-deps "$TORCHREC"
  "$PY" -c "$CHECK"
  wait_apt
  log "npm: $BUILDIFIER (into $VENV/lint)"
  mkdir -p "$VENV/lint"
  (cd "$VENV/lint" && npm install --silent --no-save --no-audit --no-fund "$BUILDIFIER" >/dev/null)
  "$BUILDIFIER_BIN" --version >/dev/null
  if "$PY" -m pip show -q fbgemm-gpu >/dev/null 2>&1; then
    log "warning: the CUDA package fbgemm-gpu is installed too; remove it with: $PY -m pip uninstall fbgemm-gpu"
  fi
  echo "$STAMP_CONTENT" > "$STAMP"
fi
wait_apt
