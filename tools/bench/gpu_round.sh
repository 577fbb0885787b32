#!/bin/bash
# One device round: build and run the GPU tests, then the embedding and table
# benchmarks, writing each output to $OUT (default: .gpu_round/) as well.
#
#   bash tools/bench/gpu_round.sh [tests|embedding|table|variants]...   (default: the first three)
#
# Needs a CUDA machine; the torchrec/fbgemm bundle in .gpupkg/ for the FBGEMM
# baselines (see docs/testing.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu_round}
mkdir -p "$OUT"
PY=${PY:-python3}
PROFILE=${PROFILE:-}
if [ -f .gpupkg/bin/remote_setup.sh ]; then
  # shellcheck disable=SC1091
  source .gpupkg/bin/remote_setup.sh > /dev/null 2>&1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests embedding table)
for part in "${parts[@]}"; do
  case $part in
    tests)
      bash tools/run_gpu_tests.sh -n 8 -q --tb=short > "$OUT/gpu_tests_full.txt" 2>&1
      tail -40 "$OUT/gpu_tests_full.txt" | tee "$OUT/gpu_tests.txt"
      { readelf -d dynamicemb/_C*.so | grep NEEDED; echo "libstdc++.so: $(g++ -print-file-name=libstdc++.so)"; } | tee -a "$OUT/gpu_tests.txt"
      ;;
    embedding)
      for opt in sgd adam; do
        for pool in none sum; do
          timeout 120 "$PY" tools/bench/embedding_bench.py --device cuda $PROFILE --tables 10 \
            --lookups 104857 --dim 128 --rows 1677721 --optimizer "$opt" --pooling "$pool" 2>&1 \
            | tail -${TAIL:-12} | tee -a "$OUT/embedding.txt"
        done
      done
      ;;
    table)
      timeout 400 "$PY" tools/bench/table_gpu_bench.py --reps 7 2>&1 | tee "$OUT/table.txt"
      ;;
    variants)
      timeout 300 bash tools/bench/table_gpu_variants.sh 2>&1 | tee "$OUT/table_variants.txt"
      ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
