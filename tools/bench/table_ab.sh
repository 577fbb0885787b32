#!/bin/bash
# A benchmark for two builds on one machine, in turns: a base checkout (its
# sources in BASE_DIR, e.g. `git archive REV | tar -x -C BASE_DIR`) against
# this one. Both are built with CUDA (in parallel), then the benchmark of this
# checkout runs against each build's package, ROUNDS times (default 2), base
# first: tools/bench/$AB_BENCH (default table_gpu_bench.py), its lines that
# match AB_LINES (an extended regex; default the table benchmark's rows).
#
#   bash tools/bench/table_ab.sh BASE_DIR [the benchmark's args]
#   AB_BENCH=storage_stages.py AB_LINES="ms/step|tile_run_kernel|lookup_graph" \
#     bash tools/bench/table_ab.sh BASE_DIR --device cuda --tables 4 --parts steps stages
set -uo pipefail
cd "$(dirname "$0")/../.."
BASE=$(cd "$1" && pwd)
shift
PY=${PY:-python3}
jobs=$(( $(nproc) / 2 ))
build() {
  (cd "$1" && DEMB_BUILD_CUDA=1 DEMB_CUDA_ARCHS=${DEMB_CUDA_ARCHS:-90} MAX_JOBS=$jobs \
    "$PY" setup.py -q build_ext --inplace > "$2" 2>&1)
}
t0=$(date +%s)
build "$BASE" /tmp/table_ab_base.log & b=$!
build "$PWD" /tmp/table_ab_head.log & h=$!
wait $b || { tail -20 /tmp/table_ab_base.log; exit 1; }
wait $h || { tail -20 /tmp/table_ab_head.log; exit 1; }
echo "built both in $(( $(date +%s) - t0 )) s"
for round in $(seq "${ROUNDS:-2}"); do
  for side in base head; do
    root=$PWD
    [ "$side" = base ] && root=$BASE
    echo "== $side, round $round"
    PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$PY" "tools/bench/${AB_BENCH:-table_gpu_bench.py}" \
      "$@" | grep -E "${AB_LINES:-^\| [0-9]+ }"
  done
done
