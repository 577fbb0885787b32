#!/bin/bash
# Times the CUDA kernel variants of the table in one go (lanes per key for
# find; lanes of a tile per bucket run for insert, 0 the default, 1 the earlier
# thread per run), each in its own process since the lane counts are read once
# per process.
#
#   bash tools/bench/table_gpu_variants.sh [extra table_gpu_bench.py args]
#
# Needs the extension built in place (tools/run_gpu_tests.sh does it).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
# Pairs "find_lanes/run_lanes" (VARIANTS overrides them).
for pair in ${VARIANTS:-2/0 4/0 8/0 16/0 4/1}; do
  find_lanes=${pair%/*} run_lanes=${pair#*/}
  echo "== DEMB_CUDA_FIND_LANES=$find_lanes DEMB_CUDA_RUN_LANES=$run_lanes"
  DEMB_CUDA_FIND_LANES=$find_lanes DEMB_CUDA_RUN_LANES=$run_lanes \
    "$PY" tools/bench/table_gpu_bench.py --load-factors 0.5 1.0 --reps 5 "$@" \
    | grep -E "^\| [0-9]+ "
done
