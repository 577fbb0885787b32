#!/usr/bin/env bash
# The project's main job, as given in README.md: installs what is missing,
# builds the extension into the tree (setup.py, incremental), and runs the
# demonstration on the GPU when there is one, else on the CPU.
# Extra arguments go to the job (see `tools/demo_table.py --help`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup_env.sh
.venv/bin/python setup.py -q build_ext --inplace > /dev/null
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python tools/demo_table.py "$@"
