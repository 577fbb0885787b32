#!/bin/bash
# One device round: build and run the GPU tests, then the embedding and table
# benchmarks, writing each output to $OUT (default: .gpu_round/) as well.
#
#   bash tools/bench/gpu_round.sh [tests|embedding|table|admission|variants|evict|evict_tests|evict_bench|multigpu|checkpoint|metrics|storage|stages_ncu|replication|inference|fp8|sharded|dlrm|soak|wheel|resume]...
#   (default: tests, embedding, table, admission)
#
# evict: the run kernels of insert and insert_and_evict in one call of under ten
# minutes (EVICT_DEADLINE, default 570 s from the part's start, build included; each
# step under a timeout that keeps to it, skipped when too little time is left), in
# order: the `gpu` tests of tests/table and tests/admission with the default kernel
# choice (by the call's keys a bucket); the table benchmark of insert_and_evict and insert
# under the earlier kernel (DEMB_CUDA_RUN_LANES=1), the default and tiles of 4, 8, 16
# and 32 lanes, one process each, with HierarchicalKV's figures beside them
# (tools/bench/table_gpu_bench.py --run-lanes; EVICT_LANES, EVICT_BENCH_ARGS, default
# --dims 32 64 --reps 5), then into tables of 2^c slots (EVICT_SWEEP, default
# "26 24 22": 2, 8 and 32 of a call's 2^20 keys a bucket of 128 on average) under a
# thread per run and tiles of 8 and 32, for where the default's switch between them
# belongs (kTileMinKeysPerBucket); the tiles' and the parity tests under 32, 1, 16
# and 4 lanes;
# the per-kernel profiles of insert_and_evict at load 0.5 and 1.0 under the earlier
# kernel and the default (tools/bench/table_gpu_profile.py); the cache's stages
# (tools/bench/storage_stages.py, its buckets 1,024 slots wide) under both; the
# `gpu` tests of tests/storage. Summary in $OUT/evict.txt, each step's output in
# $OUT/evict_*.txt. evict_tests runs the tests alone, evict_bench the figures alone.
#
# storage: the `gpu` tests of tests/storage, then tools/bench/storage_dmp_bench.py
# through DistributedModelParallel on one GPU (10 tables x 1,677,721 rows, dim 128,
# 65,536 ids per feature and step, every batch new to the tables): the EBC, then the
# EC, each with SGD and Adam at HBM budgets of 10 % and 50 % (the dynamic all-HBM,
# cached and hybrid tables and TorchRec's fused_uvm_caching; the two caches through
# TorchRec's prefetch pipeline at 10 %; the EBC with TorchRec's fused beside them),
# each row with the bytes it moved, its own floor and its targets; then
# tools/bench/storage_stages.py (the cache's step with its victims written at once
# and staged, with and without prefetch; its stages, and the prefetch's; the bus's
# speed each way rows can cross it). Summary in $OUT/storage.txt, the tests' output in
# storage_tests.txt, each benchmark's in storage_dmp_{ebc,ec}.txt and .json, the
# stages in storage_stages.txt. STORAGE_PARTS picks the parts ("tests ebc ec
# stages", the default; e.g. "tests ebc" in one device call and "ec stages" in the
# next). STORAGE_DMP_ARGS is appended to both benchmarks' flags (e.g. "--rows
# 400000" for a smaller size, "--profile-steps 3" for where each configuration's
# step spends its time; the full one holds 26 GiB of Adam rows, twice for a cache
# over a host table). STORAGE_MODULE_BENCH=1 adds the module-level
# tools/bench/storage_bench.py (STORAGE_BENCH_ARGS replaces its size flags; default
# 2 tables x 1,000,000 rows). Timeouts in seconds: STORAGE_TESTS_TIMEOUT (180, the
# tests 8 at a time with pytest-xdist), STORAGE_EBC_TIMEOUT (240), STORAGE_EC_TIMEOUT
# (240: the EC with every cache full took 198 s on an H100), STORAGE_STAGES_TIMEOUT
# (150), STORAGE_BENCH_TIMEOUT (150): at most about 14 minutes after the build, each
# part printing its rows as they come (two device calls: STORAGE_PARTS="tests ebc",
# then "ec stages").
#
# stages_ncu: Nsight Compute on the cache's step, where its kernels wait
# (tools/bench/storage_stages.py --parts steps, its flags STAGES_NCU_ARGS, default
# "--tables 4 --rounds 1": the cache full and evicting by then): the launches of the
# kernels whose names match STAGES_NCU_KERNELS (default
# "tile_run_kernel|copy_rows_kernel"), STAGES_NCU_COUNT (6) of them after the first
# STAGES_NCU_SKIP (150), with the speed-of-light, memory, occupancy, warp-state,
# scheduler and SASS source sections. Writes $OUT/stages_ncu.txt;
# STAGES_NCU_TIMEOUT (300) in seconds.
#
# wheel: the wheel as pip builds it here (`pip wheel --no-build-isolation --no-deps`,
# CUDA, the archs of cc/sources.bzl), then `tools/check_dist.py --wheel`: it requires
# exactly this torch release and the extras, its extension is stripped and imports
# from the unpacked wheel with its CUDA kernels. Writes $OUT/wheel.txt (the build's
# log in $OUT/wheel_build.txt); WHEEL_BUILD_TIMEOUT (900) in seconds.
#
# Needs a CUDA machine; the torchrec/fbgemm bundle in .gpupkg/ for the FBGEMM
# baselines (see docs/testing.md).
#
# fp8: rows in eight bits on the device in one call: the FP8 GPU tests (CUDA against
# the CPU: tests/embedding/test_fp8_rows.py, tests/storage/test_fp8_training.py), the
# train step in FP8 against float32 in one run with the kernels of each
# (tools/bench/embedding_bench.py --embedding-dtype float8_e4m3fn --profile: SGD at
# 10 x 1,677,721 rows, Adam at 500,000 rows a table, which fit one H100 together),
# then the inference table's lookups of every row format (tools/bench/inference_bench.py,
# 4 tables of 2M keys, dim 128). Into $OUT/fp8.txt; FP8_TIMEOUT (120) in seconds a step.
#
# admission: the GPU tests of admission and of the lookup's CUDA graphs
# (tests/admission, tests/embedding/test_cuda_graphs.py, test_sync_free.py; output in
# $OUT/admission_tests.txt, its result line in the summary), then the embedding train
# step with a FrequencyAdmissionStrategy(2) against the same step without, in one run
# (SUM and NONE pooling), into $OUT/admission.txt: its "admission overhead" line (the
# target is under 10 % extra) says how many lookups each replayed from CUDA graphs.
# ADMISSION_TESTS_TIMEOUT (600) in seconds.
#
# multigpu: NCCL over every visible GPU (one process per GPU). Builds
# dynamicemb._C with CUDA if it is not built yet, then, each under a timeout:
# the sharded EmbeddingCollection benchmark against TorchRec
# (tools/bench/sharded_ec_bench.py), the `multigpu` tests (tests/shard,
# tests/twin, tests/checkpoint, tests/storage, tests/replication, tests/admission), the main
# job (examples/train_dlrm.py --device cuda --steps 500).
# Writes multigpu_*.txt to $OUT and prints a summary (also $OUT/multigpu.txt).
# Timeouts in seconds: MG_BENCH_TIMEOUT (180), MG_TESTS_TIMEOUT (300),
# MG_TRAIN_TIMEOUT (60), MG_BUILD_TIMEOUT (300); MG_BENCH_ARGS replaces the
# benchmark's step counts.
#
# sharded: a full-size training step through DistributedModelParallel
# (tools/bench/sharded_ec_bench.py: 10 tables of dim 128, one feature each,
# power law over 1,677,721 rows, SGD and Adam, dynamic tables with every row in
# HBM, with and without CUDA graphs of the lookup, against TorchRec's tables
# as its planner places them unconstrained, table_wise and row_wise; with the
# per-stage profile and the HBM floor): an EmbeddingCollection of 104,857 ids
# per feature per step and GPU, then an EmbeddingBagCollection (SUM) of 65,536,
# each on one GPU, then on every visible GPU when there are several; before
# it the GPU tests of the training step without synchronization, of
# torch.compile and of the CUDA graphs (tests/embedding/test_sync_free.py,
# test_compile.py, test_cuda_graphs.py, tests/shard/test_sharded_sync_free.py, and the
# batch check's op against its CPU kernel, tests/shard/test_check_batch_op.py).
# Writes $OUT/sharded.txt (the summary), sharded_tests.txt,
# sharded_{ec,ebc}_{1,N}gpu.txt and .json. Timeouts: SHARDED_TESTS_TIMEOUT
# (240), SHARDED_BENCH_TIMEOUT (240 per run); SHARDED_BENCH_ARGS replaces the
# step counts.
#
# dlrm: on one GPU, in under five minutes once the extension is built (DLRM_MC_TIMEOUT
# 150 and DLRM_BENCH_TIMEOUT 120 seconds): the sharded EmbeddingCollection step
# (tools/bench/sharded_ec_bench.py, the `sharded` part's shape: 10 tables x 1,677,721
# rows, dim 128, 104,857 ids per feature, SGD and Adam) with ids drawn from ten times
# the rows, TorchRec's planner and table_wise plans (ids modulo the rows) beside its
# managed-collision tables (--mc mch, sized as the dynamic tables, evicting) and the
# dynamic tables; then the main job's --preset criteo model with DCN
# (tools/bench/dlrm_bench.py: 26 Criteo-sized tables capped to 24 GiB, dim 128, batch
# 8,192) with dynamic tables and with TorchRec's static tables, examples/s of each.
# Writes $OUT/dlrm.txt (the summary), dlrm_mc.txt and .json, dlrm_bench.txt and
# .json; DLRM_MC_ARGS and DLRM_BENCH_ARGS replace the step counts.
#
# resume: the main job under torchrun on every visible GPU (NCCL), checkpointing
# every 100 of RESUME_STEPS (400) steps, once uninterrupted and once with rank 0
# SIGKILLed in step 250 and restarted by torchrun (--max-restarts 1 --resume);
# then the two final checkpoints compared part by part (bit for bit, or the
# largest difference). Writes $OUT/resume.txt (runs in resume_{ref,run}.txt);
# RESUME_TIMEOUT (300) per run.
#
# metrics: the metrics' GPU tests (`pytest -m gpu tests/metrics`: no more
# synchronizations in a training step with metrics than without) and the train
# step with /metrics scraped every second against none
# (tools/bench/metrics_bench.py). Writes $OUT/metrics.txt. Needs the
# OpenTelemetry wheels in .gpupkg/wheels (docs/testing.md).
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
# A benchmark's output without the extension's op-registration lines and
# Python's warnings.
without_noise() {
  grep -v "registered at\|backend fallback\|Warning\|warn("
}

# "ok", "timed out after N s" or "failed (exit N)" for a command's status.
status_word() {
  case $1 in
    0) echo "ok" ;;
    124|137) echo "timed out after $2 s" ;;
    *) echo "failed (exit $1)" ;;
  esac
}

# Builds dynamicemb._C with CUDA kernels (run_gpu_tests.sh's build) unless it
# is there; appends the outcome to the summary file $1. Fails when the build does.
build_cuda() {
  local sum=$1 rc t0
  if "$PY" -c "from dynamicemb.table._native import extension; import sys; sys.exit(0 if extension().cuda_built() else 1)" > /dev/null 2>&1; then
    return 0
  fi
  t0=$(date +%s)
  DEMB_CUDA_ARCHS=${DEMB_CUDA_ARCHS:-90} DEMB_BUILD_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    timeout -k 10 "${MG_BUILD_TIMEOUT:-300}" "$PY" setup.py -q build_ext --inplace > "$OUT/build.txt" 2>&1
  rc=$?
  echo "build: $(status_word $rc "${MG_BUILD_TIMEOUT:-300}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  [ $rc -ne 0 ] && tail -30 "$OUT/build.txt"
  return $rc
}

# Starts the summary file $1 of a one-GPU part: emptied, then torch's version and
# the GPU's name, then build_cuda's outcome. Fails when the build does.
begin_part() {
  : > "$1"
  "$PY" -c "import torch; print(f'torch {torch.__version__},', torch.cuda.get_device_name(0))" 2>&1 | tee -a "$1"
  build_cuda "$1"
}

metrics_part() {
  local sum="$OUT/metrics.txt"
  : > "$sum"
  build_cuda "$sum" || return
  if ! "$PY" -c "import opentelemetry.sdk, opentelemetry.exporter.prometheus" > /dev/null 2>&1; then
    echo "metrics: opentelemetry-sdk / opentelemetry-exporter-prometheus missing (add their wheels to .gpupkg/wheels, docs/testing.md)" | tee -a "$sum"
    return
  fi
  timeout -k 10 300 "$PY" -m pytest -m gpu tests/metrics -q -s -p no:cacheprovider > "$OUT/metrics_tests_full.txt" 2>&1
  grep -E "^synchronizations|passed|failed|skipped|Error" "$OUT/metrics_tests_full.txt" | tail -5 | tee -a "$sum"
  timeout -k 10 300 "$PY" tools/bench/metrics_bench.py --device cuda --tables 10 --lookups 104857 \
    --dim 128 --rows 1677721 --seconds 5 --rounds 6 2>&1 | tail -4 | tee -a "$sum"
}

multigpu_part() {
  local sum="$OUT/multigpu.txt" rc t0
  : > "$sum"
  "$PY" -c "import torch; n = torch.cuda.device_count(); print(f'torch {torch.__version__}, {n} GPU(s):', ', '.join(sorted({torch.cuda.get_device_name(i) for i in range(n)})))" 2>&1 | tee -a "$sum"
  build_cuda "$sum" || return
  # 1. Benchmark: sharded EmbeddingCollection, dynamicemb against TorchRec.
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 10 "${MG_BENCH_TIMEOUT:-180}" "$PY" tools/bench/sharded_ec_bench.py --device cuda \
    ${MG_BENCH_ARGS:---warmup 3 --steps 10} > "$OUT/multigpu_bench.txt" 2>&1
  rc=$?
  echo "benchmark: $(status_word $rc "${MG_BENCH_TIMEOUT:-180}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  grep -E '^(torchrec|dynamicemb):|^\||^`' "$OUT/multigpu_bench.txt" | tee -a "$sum"
  [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/multigpu_bench.txt" | tail -15
  # 2. The distributed tests on NCCL (one pytest worker per test file when
  # pytest-xdist is there: the two files' worlds run side by side).
  t0=$(date +%s)
  local report="$OUT/multigpu_tests.xml" par=()
  rm -f "$report"
  "$PY" -c "import xdist" > /dev/null 2>&1 && par=(-n 2 --dist loadfile)
  timeout -k 10 "${MG_TESTS_TIMEOUT:-300}" "$PY" -m pytest -m multigpu tests/shard tests/twin tests/checkpoint tests/storage tests/replication tests/admission -q --tb=short \
    -p no:cacheprovider ${par[@]+"${par[@]}"} --junitxml="$report" > "$OUT/multigpu_tests_full.txt" 2>&1
  rc=$?
  echo "tests: $(status_word $rc "${MG_TESTS_TIMEOUT:-300}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  if [ -f "$report" ]; then
    "$PY" - "$report" <<'PYEOF' | tee -a "$sum"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
for s in suites:
    for case in s.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            print("FAILED", case.get("classname"), case.get("name"))
print(f"{tests - failed - skipped} passed, {failed} failed, {skipped} skipped")
PYEOF
  else
    tail -20 "$OUT/multigpu_tests_full.txt"
    echo "0 passed, 1 failed (no report: the run $(status_word $rc "${MG_TESTS_TIMEOUT:-300}"))" | tee -a "$sum"
  fi
  # 3. The main job on every GPU.
  t0=$(date +%s)
  timeout -k 10 "${MG_TRAIN_TIMEOUT:-60}" "$PY" examples/train_dlrm.py --device cuda --steps 500 \
    --summary-json "$OUT/multigpu_train.json" > "$OUT/multigpu_train.txt" 2>&1
  rc=$?
  echo "main job: $(status_word $rc "${MG_TRAIN_TIMEOUT:-60}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  grep -E '^(DLRM on|trained|train loss|eval )' "$OUT/multigpu_train.txt" | tee -a "$sum"
  [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/multigpu_train.txt" | tail -15
  return 0
}

resume_part() {
  local sum="$OUT/resume.txt" rc t0 gpus run extra
  : > "$sum"
  build_cuda "$sum" || return
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  rm -rf "$OUT/resume_ref" "$OUT/resume_run"
  for run in ref run; do
    extra=()
    [ "$run" = run ] && extra=(--resume --crash-at step:250:0)
    t0=$(date +%s)
    timeout -k 10 "${RESUME_TIMEOUT:-300}" "$PY" -m torch.distributed.run --standalone \
      --nproc-per-node "$gpus" --max-restarts 1 examples/train_dlrm.py --device cuda \
      --steps "${RESUME_STEPS:-400}" --checkpoint-every 100 --checkpoint-dir "$OUT/resume_$run" \
      --summary-json "$OUT/resume_$run.json" "${extra[@]}" > "$OUT/resume_$run.txt" 2>&1
    rc=$?
    echo "$run: $(status_word $rc "${RESUME_TIMEOUT:-300}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
    grep -E '^(DLRM on|resumed from|rank .*SIGKILL|trained|train loss|eval )' "$OUT/resume_$run.txt" \
      | tee -a "$sum"
    [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/resume_$run.txt" | tail -15
  done
  "$PY" - "$OUT" "${RESUME_STEPS:-400}" <<'PYEOF' 2>&1 | grep -v "Warning\|warn(" | tee -a "$sum"
import os, sys, tempfile
sys.path[:0] = ["examples", "tests/main_job"]
import job_harness as j, torch, train_checkpoint as tc
out, steps = sys.argv[1], int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    a, b = (j.read_checkpoint(tc.step_dir(os.path.join(out, f"resume_{r}"), steps), tmp) for r in ("ref", "run"))
def gap(x, y):
    """None when equal bit for bit, else the largest difference."""
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    if x.shape != y.shape:
        return float("inf")
    return None if torch.equal(x, y) else float((x.double() - y.double()).abs().max())
def line(what, pairs):
    gaps = [g for g in (gap(x, y) for x, y in pairs) if g is not None]
    print(f"{what}: " + (f"all {len(pairs)} equal" if not gaps else f"{len(gaps)} of {len(pairs)} differ, max |diff| {max(gaps):.3g}"))
for name, t in a["tables"].items():
    line(f"table {name} (keys, emb, opt, scores)", [(t[c], b["tables"][name][c]) for c in ("keys", "emb", "opt", "scores")])
line("torchrec tensors", [(v, b["torchrec"][k]) for k, v in a["torchrec"].items()])
line("dense optimizer state", [(v, b["dense_optim"][k]) for k, v in a["dense_optim"].items()])
PYEOF
  return 0
}

sharded_part() {
  local sum="$OUT/sharded.txt" rc t0 world tag gpus
  : > "$sum"
  "$PY" -c "import torch; n = torch.cuda.device_count(); print(f'torch {torch.__version__}, {n} GPU(s):', ', '.join(sorted({torch.cuda.get_device_name(i) for i in range(n)})))" 2>&1 | tee -a "$sum"
  build_cuda "$sum" || return
  t0=$(date +%s)
  timeout -k 10 "${SHARDED_TESTS_TIMEOUT:-240}" "$PY" -m pytest -m "gpu or multigpu" -q -rs --tb=short \
    -p no:cacheprovider tests/embedding/test_sync_free.py tests/embedding/test_compile.py \
    tests/embedding/test_cuda_graphs.py tests/shard/test_sharded_sync_free.py \
    tests/shard/test_check_batch_op.py > "$OUT/sharded_tests.txt" 2>&1
  rc=$?
  echo "tests: $(status_word $rc "${SHARDED_TESTS_TIMEOUT:-240}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/sharded_tests.txt" | tail -12 | tee -a "$sum"
  local shape=(--tables 10 --features 10 --hotness 1 --dim 128 --rows 1677721)
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  local worlds=(1)
  [ "$gpus" -gt 1 ] && worlds+=("$gpus")
  # EC: 104,857 ids per feature and GPU; EBC: 65,536 bags of one id per feature and GPU.
  local coll per
  for coll in ec ebc; do
    per=104857
    [ "$coll" = ebc ] && per=65536
    for world in "${worlds[@]}"; do
      tag="${coll}_${world}gpu"
      t0=$(date +%s)
      # shellcheck disable=SC2086
      timeout -k 10 "${SHARDED_BENCH_TIMEOUT:-240}" "$PY" tools/bench/sharded_ec_bench.py --device cuda \
        --collection "$coll" --world-size "$world" --batch $((per * world)) "${shape[@]}" \
        --optimizer sgd adam --eager ${SHARDED_BENCH_ARGS:---warmup 5 --steps 20 --profile-steps 2} \
        --json "$OUT/sharded_$tag.json" > "$OUT/sharded_$tag.txt" 2>&1
      rc=$?
      echo "benchmark ($coll, $world GPU): $(status_word $rc "${SHARDED_BENCH_TIMEOUT:-240}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
      grep -E '^(torchrec|dynamicemb)|^\||^`|^\*|^Per step|^Host|^[0-9]+ x ' "$OUT/sharded_$tag.txt" | tee -a "$sum"
      [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/sharded_$tag.txt" | tail -15
    done
  done
  return 0
}

dlrm_part() {
  local sum="$OUT/dlrm.txt" rc t0
  begin_part "$sum" || return
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 10 "${DLRM_MC_TIMEOUT:-150}" "$PY" tools/bench/sharded_ec_bench.py --device cuda \
    --world-size 1 --collection ec --batch 104857 --tables 10 --features 10 --hotness 1 \
    --dim 128 --rows 1677721 --id-space 16777210 --optimizer sgd adam \
    --plans planner table_wise --mc mch ${DLRM_MC_ARGS:---warmup 5 --steps 20} \
    --json "$OUT/dlrm_mc.json" > "$OUT/dlrm_mc.txt" 2>&1
  rc=$?
  echo "managed collisions: $(status_word $rc "${DLRM_MC_TIMEOUT:-150}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  grep -E '^\||^`|^\*|^[0-9]+ x ' "$OUT/dlrm_mc.txt" | tee -a "$sum"
  [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/dlrm_mc.txt" | tail -15
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 10 "${DLRM_BENCH_TIMEOUT:-120}" "$PY" tools/bench/dlrm_bench.py --device cuda \
    --world-size 1 --preset criteo --interaction dcn ${DLRM_BENCH_ARGS:---warmup 5 --steps 20 --rounds 3} \
    --json "$OUT/dlrm_bench.json" > "$OUT/dlrm_bench.txt" 2>&1
  rc=$?
  echo "dlrm_bench: $(status_word $rc "${DLRM_BENCH_TIMEOUT:-120}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  grep -E '^\||^`|^(dynamic|static)[: ]|^both|^DLRM on|^[0-9]+ x ' "$OUT/dlrm_bench.txt" | tee -a "$sum"
  [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/dlrm_bench.txt" | tail -15
  return 0
}

storage_part() {
  local sum="$OUT/storage.txt" rc t0 kind parts=" ${STORAGE_PARTS:-tests ebc ec stages} " par=()
  begin_part "$sum" || return
  if [[ $parts == *" tests "* ]]; then
    "$PY" -c "import xdist" > /dev/null 2>&1 && par=(-n 8)
    t0=$(date +%s)
    timeout -k 10 "${STORAGE_TESTS_TIMEOUT:-180}" "$PY" -m pytest -m gpu tests/storage -q --tb=short -rs \
      -p no:cacheprovider ${par[@]+"${par[@]}"} > "$OUT/storage_tests.txt" 2>&1
    rc=$?
    echo "tests: $(status_word $rc "${STORAGE_TESTS_TIMEOUT:-180}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/storage_tests.txt" | tail -20 | tee -a "$sum"
  fi
  for kind in ebc ec; do
    [[ $parts == *" $kind "* ]] || continue
    local flags=(--kinds ebc --optimizers sgd adam --budgets 0.1 0.5 --prefetch-budgets 0.1)
    local limit=${STORAGE_EBC_TIMEOUT:-240}
    if [ "$kind" = ec ]; then
      flags=(--kinds ec --optimizers sgd adam --budgets 0.1 0.5 --prefetch-budgets 0.1
        --configs dynamic_hbm torchrec_uvm cache hybrid torchrec_uvm_prefetch cache_prefetch)
      limit=${STORAGE_EC_TIMEOUT:-240}
    fi
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" "$PY" tools/bench/storage_dmp_bench.py --device cuda "${flags[@]}" \
      --warmup 10 --steps 10 --json "$OUT/storage_dmp_$kind.json" ${STORAGE_DMP_ARGS:-} \
      > "$OUT/storage_dmp_$kind.txt" 2>&1
    rc=$?
    echo "benchmark ($kind): $(status_word $rc "$limit") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
    grep -E '^(NVIDIA|CPU|ebc |ec |target )|^\||^`' "$OUT/storage_dmp_$kind.txt" | tee -a "$sum"
    [ $rc -ne 0 ] && grep -v "registered at\|backend fallback" "$OUT/storage_dmp_$kind.txt" | tail -15
  done
  if [[ $parts == *" stages "* ]]; then
    t0=$(date +%s)
    timeout -k 10 "${STORAGE_STAGES_TIMEOUT:-150}" "$PY" tools/bench/storage_stages.py --device cuda \
      > "$OUT/storage_stages.txt" 2>&1
    rc=$?
    echo "stages: $(status_word $rc "${STORAGE_STAGES_TIMEOUT:-150}") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
    grep -E "^==|ms/step|GB/s|cache_|prefetch_|run_kernel|copy_rows_kernel|lookup_graph" "$OUT/storage_stages.txt" | tee -a "$sum"
  fi
  if [ "${STORAGE_MODULE_BENCH:-0}" = 1 ]; then
    # shellcheck disable=SC2086
    timeout -k 10 "${STORAGE_BENCH_TIMEOUT:-150}" "$PY" tools/bench/storage_bench.py --device cuda \
      ${STORAGE_BENCH_ARGS:---tables 2 --rows 1000000 --dim 128 --optimizer adam --steps 8 --warmup 2} 2>&1 \
      | without_noise | tee -a "$sum"
  fi
  return 0
}

# The run kernels of insert and insert_and_evict (evict, evict_tests, evict_bench):
# steps in order of importance, each under a timeout that keeps the part within
# EVICT_DEADLINE seconds of its start (skipped when too little is left).
evict_part() {
  local what=$1 sum="$OUT/$1.txt" start deadline par=() lanes lf tag
  start=$(date +%s)
  deadline=$(( start + ${EVICT_DEADLINE:-570} ))
  begin_part "$sum" || return
  "$PY" -c "import xdist" > /dev/null 2>&1 && par=(-n 8)
  # step NAME CAP_S LOG CMD...: runs CMD (output to LOG) under min(CAP_S, time left).
  step() {
    local name=$1 cap=$2 log=$3 left rc t0
    shift 3
    left=$(( deadline - $(date +%s) - 5 ))
    if [ "$left" -lt 30 ]; then
      echo "$name: skipped ($left s left)" | tee -a "$sum"
      return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    t0=$(date +%s)
    timeout -k 5 "$cap" "$@" > "$log" 2>&1
    rc=$?
    echo "$name: $(status_word $rc "$cap") in $(( $(date +%s) - t0 )) s" | tee -a "$sum"
  }
  # Tests: the table's and the counter's GPU tests with the default kernel, then
  # the tiles' and the parity tests under every other run-lane value.
  local parity=(tests/table/test_cuda_tile_runs.py tests/table/test_cuda_parity.py
    tests/table/test_held_slots.py
    tests/admission/test_counter.py)
  tests_default() {
    step "gpu tests, default kernel" 300 "$OUT/evict_tests_default.txt" "$PY" -m pytest -m gpu \
      tests/table tests/admission -q --tb=short -p no:cacheprovider ${par[@]+"${par[@]}"}
    grep -E "passed|failed" "$OUT/evict_tests_default.txt" | tail -1 | tee -a "$sum"
    grep -E "^(FAILED|ERROR)" "$OUT/evict_tests_default.txt" | head -10 | tee -a "$sum"
  }
  tests_lanes() {
    for lanes in 32 1 16 4; do
      step "parity tests, DEMB_CUDA_RUN_LANES=$lanes" 120 "$OUT/evict_tests_$lanes.txt" \
        env DEMB_CUDA_RUN_LANES=$lanes "$PY" -m pytest -m gpu "${parity[@]}" -q --tb=short \
        -p no:cacheprovider ${par[@]+"${par[@]}"}
      grep -E "passed|failed" "$OUT/evict_tests_$lanes.txt" | tail -1 | tee -a "$sum"
      grep -E "^(FAILED|ERROR)" "$OUT/evict_tests_$lanes.txt" | head -5 | tee -a "$sum"
    done
  }
  tests_storage() {
    step "storage gpu tests" 240 "$OUT/evict_tests_storage.txt" "$PY" -m pytest -m gpu \
      tests/storage -q --tb=short -p no:cacheprovider ${par[@]+"${par[@]}"}
    grep -E "passed|failed" "$OUT/evict_tests_storage.txt" | tail -1 | tee -a "$sum"
  }
  # Figures: the inserts under each kernel with HierarchicalKV's beside them,
  # the per-kernel profiles, the cache's stages.
  bench() {
    # shellcheck disable=SC2086
    step "table benchmark" 240 "$OUT/evict_table.txt" "$PY" tools/bench/table_gpu_bench.py \
      --run-lanes ${EVICT_LANES:-1 0 4 8 16 32} ${EVICT_BENCH_ARGS:---dims 32 64 --reps 5}
    sed -n '/^insert_and_evict, B keys/,$p' "$OUT/evict_table.txt" | tee -a "$sum"
    # The same inserts into smaller tables (more of a call's keys a bucket:
    # 2^20 keys into 2^c slots of buckets of 128), under each kernel forced,
    # for where the default's switch from a thread per run to tiles belongs.
    for c in ${EVICT_SWEEP:-26 24 22}; do
      step "table benchmark, 2^$c slots" 90 "$OUT/evict_table_$c.txt" "$PY" \
        tools/bench/table_gpu_bench.py --run-lanes 1 8 32 --dims 32 --load-factors 0.5 1.0 \
        --reps 3 --capacity-log2 "$c"
      sed -n '/^insert_and_evict, B keys/,/^insert, B keys/p' "$OUT/evict_table_$c.txt" \
        | grep '^|' | tee -a "$sum"
    done
  }
  profiles() {
    for lanes in 1 0; do
      for lf in 0.5 1.0; do
        tag="lanes${lanes}_lf$lf"
        step "profile, DEMB_CUDA_RUN_LANES=$lanes, load $lf" 90 "$OUT/evict_profile_$tag.txt" \
          env DEMB_CUDA_RUN_LANES=$lanes "$PY" tools/bench/table_gpu_profile.py --load-factor "$lf"
        grep -E "kernel|Kernel|Self CUDA time total" "$OUT/evict_profile_$tag.txt" | head -12 | tee -a "$sum"
      done
    done
  }
  stages() {
    for lanes in 1 0; do
      step "cache stages, DEMB_CUDA_RUN_LANES=$lanes" 150 "$OUT/evict_stages_lanes$lanes.txt" \
        env DEMB_CUDA_RUN_LANES=$lanes "$PY" tools/bench/storage_stages.py --device cuda
      grep -E "cache_insert|run_kernel|lookup_graph" "$OUT/evict_stages_lanes$lanes.txt" | head -8 | tee -a "$sum"
    done
  }
  case $what in
    evict) tests_default; bench; tests_lanes; profiles; stages; tests_storage ;;
    evict_tests) tests_default; tests_lanes; tests_storage ;;
    evict_bench) bench; profiles; stages ;;
  esac
}

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests embedding table admission)
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
    admission)
      : > "$OUT/admission.txt"
      build_cuda "$OUT/admission.txt" || continue
      # The GPU tests of admission (CUDA against CPU, no synchronization in a step
      # with admission, graph replays against eager) and of the lookup's graphs.
      timeout -k 10 "${ADMISSION_TESTS_TIMEOUT:-600}" "$PY" -m pytest -m gpu tests/admission \
        tests/embedding/test_cuda_graphs.py tests/embedding/test_sync_free.py -q --tb=short \
        -p no:cacheprovider > "$OUT/admission_tests.txt" 2>&1
      grep -E "passed|failed|error" "$OUT/admission_tests.txt" | tail -3 | tee -a "$OUT/admission.txt"
      for pool in sum none; do
        timeout 180 "$PY" tools/bench/embedding_bench.py --device cuda $PROFILE --tables 10 \
          --lookups 104857 --dim 128 --rows 1677721 --optimizer sgd --pooling "$pool" \
          --admission 2 2>&1 | tail -${TAIL:-12} | tee -a "$OUT/admission.txt"
      done
      ;;
    table)
      timeout 400 "$PY" tools/bench/table_gpu_bench.py --reps 7 2>&1 | tee "$OUT/table.txt"
      ;;
    variants)
      timeout 400 bash tools/bench/table_gpu_variants.sh --dims 32 64 2>&1 | tee "$OUT/table_variants.txt"
      ;;
    evict|evict_tests|evict_bench)
      evict_part "$part"
      ;;
    multigpu)
      multigpu_part
      ;;
    checkpoint)
      : > "$OUT/checkpoint.txt"
      build_cuda "$OUT/checkpoint.txt" || continue
      # shellcheck disable=SC2086
      timeout -k 10 "${CKPT_BENCH_TIMEOUT:-600}" "$PY" tools/bench/checkpoint_bench.py --device cuda \
        ${CKPT_BENCH_ARGS:---tables 10 --rows 1600000 --dim 128} 2>&1 \
        | without_noise | tee -a "$OUT/checkpoint.txt"
      ;;
    metrics)
      metrics_part
      ;;
    sharded)
      sharded_part
      ;;
    dlrm)
      dlrm_part
      ;;
    resume)
      resume_part
      ;;
    storage)
      storage_part
      ;;
    soak)
      # The main job (examples/train_dlrm.py) for SOAK_STEPS steps on one GPU, memory
      # and counters checked every SOAK_EVERY steps (tools/soak.py, docs/benchmarks/soak.md).
      timeout -k 10 "${SOAK_TIMEOUT:-1500}" "$PY" tools/soak.py --steps "${SOAK_STEPS:-100000}" \
        --every "${SOAK_EVERY:-2000}" --summary-json "$OUT/soak.json" -- --device cuda \
        --world-size 1 2>&1 | grep -v "registered at\|backend fallback" | tail -30 | tee "$OUT/soak.txt"
      ;;
    wheel)
      rm -rf "$OUT/dist"
      DEMB_BUILD_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} timeout -k 10 "${WHEEL_BUILD_TIMEOUT:-900}" \
        "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$OUT/dist" . \
        > "$OUT/wheel_build.txt" 2>&1
      rc=$?
      echo "wheel build: $(status_word $rc "${WHEEL_BUILD_TIMEOUT:-900}")" | tee "$OUT/wheel.txt"
      if [ $rc -eq 0 ]; then
        "$PY" tools/check_dist.py --wheel "$OUT"/dist/dynamicemb-*.whl 2>&1 | tee -a "$OUT/wheel.txt"
      else
        tail -30 "$OUT/wheel_build.txt"
      fi
      ;;
    replication)
      # Delta dump and replay throughput against a full dump (docs/benchmarks/replication.md),
      # the GPU tests of tests/replication, and the serving replica example on one GPU
      # following a job on every GPU.
      : > "$OUT/replication.txt"
      build_cuda "$OUT/replication.txt" || continue
      # shellcheck disable=SC2086
      timeout -k 10 "${REPL_BENCH_TIMEOUT:-900}" "$PY" tools/bench/replication_bench.py --device cuda \
        ${REPL_BENCH_ARGS:---rows 10000000 --dim 128} 2>&1 \
        | without_noise | tee -a "$OUT/replication.txt"
      timeout -k 10 "${REPL_TESTS_TIMEOUT:-600}" "$PY" -m pytest -m gpu tests/replication tests/table/test_place.py \
        -q --tb=short -p no:cacheprovider 2>&1 | tail -15 | tee -a "$OUT/replication.txt"
      timeout -k 10 "${REPL_DEMO_TIMEOUT:-300}" "$PY" examples/serve_replica.py demo --device cuda \
        --steps 100 2>&1 | grep "^serve\|^train" | tail -8 | tee -a "$OUT/replication.txt"
      ;;
    stages_ncu)
      : > "$OUT/stages_ncu.txt"
      build_cuda "$OUT/stages_ncu.txt" || continue
      ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      if [ -z "$ncu_bin" ]; then
        echo "stages_ncu: no ncu on this machine" | tee -a "$OUT/stages_ncu.txt"
        continue
      fi
      # shellcheck disable=SC2086
      timeout -k 10 "${STAGES_NCU_TIMEOUT:-300}" "$ncu_bin" --clock-control none \
        --kernel-name "regex:${STAGES_NCU_KERNELS:-tile_run_kernel|copy_rows_kernel}" \
        --launch-skip "${STAGES_NCU_SKIP:-150}" --launch-count "${STAGES_NCU_COUNT:-6}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section SourceCounters \
        "$PY" tools/bench/storage_stages.py --device cuda --parts steps \
        ${STAGES_NCU_ARGS:---tables 4 --rounds 1} >> "$OUT/stages_ncu.txt" 2>&1
      rc=$?
      echo "stages_ncu: $(status_word $rc "${STAGES_NCU_TIMEOUT:-300}")" | tee -a "$OUT/stages_ncu.txt"
      ;;
    fp8)
      : > "$OUT/fp8.txt"
      build_cuda "$OUT/fp8.txt" || continue
      timeout -k 10 "${FP8_TIMEOUT:-120}" "$PY" -m pytest -m gpu tests/embedding/test_fp8_rows.py \
        tests/storage/test_fp8_training.py -q --tb=short -p no:cacheprovider 2>&1 | tail -5 \
        | tee -a "$OUT/fp8.txt"
      for opt_rows in "sgd 1677721" "adam 500000"; do
        read -r opt rows <<< "$opt_rows"
        timeout -k 10 "${FP8_TIMEOUT:-120}" "$PY" tools/bench/embedding_bench.py --device cuda \
          --profile --tables 10 --lookups 104857 --dim 128 --rows "$rows" --optimizer "$opt" \
          --embedding-dtype float8_e4m3fn 2>&1 | tail -${TAIL:-40} | tee -a "$OUT/fp8.txt"
      done
      timeout -k 10 "${FP8_TIMEOUT:-120}" "$PY" tools/bench/inference_bench.py --device cuda \
        --rows 2000000 --dim 128 --tables 4 --batch 8192 --repeats 20 2>&1 \
        | without_noise | tee -a "$OUT/fp8.txt"
      ;;
    inference)
      # The inference table's GPU tests (CUDA against the CPU, export and compile on the
      # device) and its lookups against TorchRec's and FBGEMM's INT8 on one GPU
      # (docs/benchmarks/inference.md), then the serving example following a job.
      : > "$OUT/inference.txt"
      build_cuda "$OUT/inference.txt" || continue
      timeout -k 10 "${INFER_TESTS_TIMEOUT:-600}" "$PY" -m pytest -m gpu tests/inference \
        -q --tb=short -p no:cacheprovider 2>&1 | tail -15 | tee -a "$OUT/inference.txt"
      # shellcheck disable=SC2086
      timeout -k 10 "${INFER_BENCH_TIMEOUT:-900}" "$PY" tools/bench/inference_bench.py --device cuda \
        ${INFER_BENCH_ARGS:---rows 5000000 --dim 128 --tables 4 --batch 8192 --compile} 2>&1 \
        | without_noise | tee -a "$OUT/inference.txt"
      timeout -k 10 "${INFER_DEMO_TIMEOUT:-300}" "$PY" examples/serve_replica.py demo --device cuda \
        --steps 60 --dtype int8 2>&1 | grep "^serve\|^train" | tail -4 | tee -a "$OUT/inference.txt"
      ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
