#!/usr/bin/env bash
# The project's main job, as given in README.md: installs what is missing,
# builds the extension into the tree (setup.py, incremental), and trains a
# small DLRM-style model on dynamic embedding tables (examples/train_dlrm.py):
# one process per visible GPU (NCCL) when there is a GPU, else two CPU
# processes (gloo), started by the job itself. Extra arguments go to the job
# (see `examples/train_dlrm.py --help`: --steps, --batch-size, --world-size,
# --device, --checkpoint-dir / --resume, --data, ...). Under torchrun, on one
# node or several, the job runs as the ranks torchrun starts (docs/training.md).
# The table layer alone is demonstrated by examples/demo_table.py.
# -h / --help answers at once: the job's options, without installing or building
# anything (once the venv has torch; before that, how to get there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for arg in "$@"; do
  if [ "$arg" = -h ] || [ "$arg" = --help ]; then
    if .venv/bin/python -c "import torch" 2>/dev/null; then
      PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python examples/train_dlrm.py --help
    fi
    echo "usage: bash tools/main.sh [options of examples/train_dlrm.py]"
    echo "Its options are listed here once ./.venv exists: run bash tools/main.sh (or"
    echo "bash tools/setup_env.sh) once to install it."
    exit 0
  fi
done

bash tools/setup_env.sh
.venv/bin/python setup.py -q build_ext --inplace > /dev/null
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python examples/train_dlrm.py "$@"
