#!/bin/bash
# Times the CUDA kernel variants of the table in one go (lanes per key for
# find, lanes per bucket run for insert; 1 = one thread per run), each in its
# own process since the lane counts are read once per process.
#
#   bash tools/bench/table_gpu_variants.sh [extra table_gpu_bench.py args]
#
# Needs the extension built in place (tools/run_gpu_tests.sh does it).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
for find_lanes in 8 16 32; do
  for run_lanes in 1 8 16; do
    echo "== DEMB_CUDA_FIND_LANES=$find_lanes DEMB_CUDA_RUN_LANES=$run_lanes"
    DEMB_CUDA_FIND_LANES=$find_lanes DEMB_CUDA_RUN_LANES=$run_lanes \
      "$PY" tools/bench/table_gpu_bench.py --dims 32 --load-factors 0.5 1.0 --reps 5 "$@" \
      | grep -E "^\| 32 "
  done
done
