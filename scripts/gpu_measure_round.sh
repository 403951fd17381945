#!/usr/bin/env bash
# One measuring round on a GPU host: measure a batch under a time budget, optionally re-measure
# a subset in a second worker run (repeatability), print the benchmarks. Results land in DIR.
#
#   bash scripts/gpu_measure_round.sh --out DIR BATCH.parquet NAME [BUDGET_S=380] [REPEAT_N=0] [REPEAT_BUDGET_S=130]
#
# On a host of several GPUs, KC_GPU=i measures on GPU i and KC_CPUS=a-b keeps the worker and all
# its children on those cores (scripts/gpu_measure_parallel.sh runs one such worker per GPU).
# KC_WORKER_ARGS adds worker flags to both worker runs (e.g. "--compile-inputs meta").
# KC_KEEP=DIR also copies the result files there (a folder that outlives DIR, so a later run
# can measure `python3 -m benchmarks.profiling remaining` of the same batch).
set -u
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then echo "usage: $0 --out DIR BATCH.parquet NAME [BUDGET_S] [REPEAT_N] [REPEAT_BUDGET_S]" >&2; exit 2; fi
out=$2; shift 2
batch=$1 name=$2 budget=${3:-380} repeat_n=${4:-0} repeat_budget=${5:-130}
pin=()
if [ -n "${KC_CPUS:-}" ]; then
  if command -v taskset > /dev/null; then pin=(taskset -c "$KC_CPUS"); else echo "warning: no taskset, cores not pinned"; fi
fi
smi_id=()
if [ -n "${KC_GPU:-}" ]; then export CUDA_VISIBLE_DEVICES=$KC_GPU; smi_id=(--id="$KC_GPU"); fi
nvidia-smi "${smi_id[@]}" --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$out/gpu-$name.txt"
"${pin[@]}" python3 -m pipelines.profiling.worker --batch "$batch" --out "$out/results-$name.parquet" ${KC_WORKER_ARGS:-} \
  --compile-workers "${KC_COMPILE_WORKERS:-12}" --timeout-s 60 --time-budget-s "$budget" --summary-json "$out/summary-$name.json" \
  > "$out/$name.log" 2>&1
tail -12 "$out/$name.log"
python3 -m benchmarks.profiling throughput "$out/results-$name.parquet" --summary "$out/summary-$name.json"
if [ "$repeat_n" -gt 0 ]; then
  python3 -m benchmarks.profiling subset "$out/results-$name.parquet" "$batch" --n "$repeat_n" --out "/tmp/repeat-$name.parquet"
  "${pin[@]}" python3 -m pipelines.profiling.worker --batch "/tmp/repeat-$name.parquet" --out "$out/results-$name-repeat.parquet" ${KC_WORKER_ARGS:-} \
    --compile-workers "${KC_COMPILE_WORKERS:-12}" --timeout-s 60 --time-budget-s "$repeat_budget" > "$out/$name-repeat.log" 2>&1
  tail -3 "$out/$name-repeat.log"
  python3 -m benchmarks.profiling compare "$out/results-$name.parquet" "$out/results-$name-repeat.parquet"
fi
if [ -n "${KC_KEEP:-}" ]; then mkdir -p "$KC_KEEP" && cp "$out"/results-"$name"*.parquet "$KC_KEEP"/; fi
