#!/usr/bin/env bash
# The search round on one GPU host (about 6 minutes wall on an H200), results into DIR:
#   (a) measure the search simulation's neighbourhood batch (scripts/build_search_batch.py) under a
#       time budget, in its priority order;
#   (b) a live search on two light tasks, standard vs surrogate-filtered at the same measurement
#       budget, measured by the profiling worker (python3 -m pipelines.search.live);
#   (c) the autotune hook on softmax: pruned by each forecaster, then exhaustive
#       (python3 -m benchmarks.autotune_demo).
#
#   bash scripts/gpu_search_round.sh --out DIR [PREP=.gpu-search]
#
# PREP (carried to the host) holds neighbourhood.parquet and, optionally, forecaster.pkl: a pickled
# object with predict_kernels(anchor, candidates, hardware_id) -> (n, 8). Without it, (b) and (c)
# use the uniform forecaster (a dry run: filtering is then a random choice).
# Env: KC_NEIGHBOURHOOD_S (190; 0 skips (a)), KC_LIVE_DEADLINE_S (90), KC_LIVE_TASKS (softmax,rms_norm),
#      KC_LIVE_SEEDS (2), KC_LIVE_BUDGET (16), KC_AUTOTUNE_TOPK (0.25), KC_COMPILE_WORKERS (12);
#      KC_DEVICE=cpu runs every stage on the Triton interpreter (tests; KC_AUTOTUNE_GRID then
#      keeps the autotune grid small, e.g. "BLOCK_N=256+512;NUM_WARPS=1+2;NUM_STAGES=1").
# Files in DIR (7): gpu.txt, results-neighbourhood.parquet, summary-neighbourhood.json,
#   results-live.parquet, kernels-live.parquet, live-search.json, autotune.json.
set -u
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then echo "usage: $0 --out DIR [PREP]" >&2; exit 2; fi
out=$2; shift 2
prep=${1:-.gpu-search}
nb_s=${KC_NEIGHBOURHOOD_S:-190}
live_s=${KC_LIVE_DEADLINE_S:-90}
workers=${KC_COMPILE_WORKERS:-12}
device=${KC_DEVICE:-cuda}
extra=(); if [ "$device" = cpu ]; then extra=(--max-reps 3); fi
grid=(); if [ -n "${KC_AUTOTUNE_GRID:-}" ]; then grid=(--grid "$KC_AUTOTUNE_GRID"); fi
log_dir=$(mktemp -d /tmp/kc-search-round.XXXX)
t0=$(date +%s)
if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$out/gpu.txt" 2>&1
fi

if [ "$nb_s" -gt 0 ]; then
echo "== (a) neighbourhood batch: $(python3 -c "import pyarrow.parquet as pq; print(pq.read_metadata('$prep/neighbourhood.parquet').num_rows)") kernels, ${nb_s} s budget"
timeout $((nb_s + 90)) python3 -m pipelines.profiling.worker --batch "$prep/neighbourhood.parquet" \
  --out "$out/results-neighbourhood.parquet" --device "$device" "${extra[@]}" --compile-workers "$workers" --timeout-s 60 \
  --time-budget-s "$nb_s" --summary-json "$out/summary-neighbourhood.json" > "$log_dir/neighbourhood.log" 2>&1
echo "exit $?"; tail -12 "$log_dir/neighbourhood.log"
fi

fc=(--forecaster uniform)
if [ -f "$prep/forecaster.pkl" ]; then fc=(--forecaster-file "$prep/forecaster.pkl"); fi
echo "== (b) live search: ${fc[*]}, deadline ${live_s} s"
timeout $((live_s + 150)) python3 -m pipelines.search.live --tasks "${KC_LIVE_TASKS:-softmax,rms_norm}" \
  --modes standard,filtered --seeds "${KC_LIVE_SEEDS:-2}" --budget "${KC_LIVE_BUDGET:-16}" "${fc[@]}" \
  --workdir "${KC_LIVE_WORKDIR:-/tmp/kc-live}" --out "$out" --deadline-s "$live_s" --device "$device" \
  --worker-arg=--compile-workers="$workers" --worker-arg=--timeout-s=60 2> "$log_dir/live.log"
echo "exit $?"; tail -4 "$log_dir/live.log"

at=(--uniform)
if [ -f "$prep/forecaster.pkl" ]; then at+=(--forecaster-file "$prep/forecaster.pkl"); fi
echo "== (c) autotune hook: ${at[*]}"
timeout 180 python3 -m benchmarks.autotune_demo --task softmax "${at[@]}" --top-k "${KC_AUTOTUNE_TOPK:-0.25}" \
  --device "$device" "${grid[@]}" --out "$out/autotune.json" 2> "$log_dir/autotune.log"
echo "exit $?"; tail -3 "$log_dir/autotune.log"
echo "== wall $(( $(date +%s) - t0 )) s; files in $out:"; ls -la "$out"
