#!/usr/bin/env bash
# One measuring call on a host of several GPUs: one worker per GPU, each on its own batch and
# its own share of the CPU cores, all under the same time budget. Results land in $OUT as
# scripts/gpu_measure_round.sh writes them, one NAME per GPU.
#
#   bash scripts/gpu_measure_parallel.sh BUDGET_S BATCH_0:NAME_0[:WORKER_FLAGS] [BATCH_1:NAME_1[:WORKER_FLAGS] ...]
#
# WORKER_FLAGS (no spaces; e.g. --compile-inputs=meta) go to that GPU's worker only, for A/B
# comparisons of harness settings on one host in one call.
# GPU i gets the i-th batch and cores [i*C, (i+1)*C) of the host's C*N cores. Timing is per
# GPU (CUDA events), and the measuring children of each worker keep two of its cores to
# themselves (pipelines/profiling/child.py), so the workers do not slow each other's launches.
set -u
budget=$1; shift
n=$#
gpus=$(nvidia-smi -L | wc -l)
[ "$n" -le "$gpus" ] || { echo "error: $n batches for $gpus GPUs"; exit 2; }
cores=$(nproc)
per=$((cores / n))
i=0
for spec in "$@"; do
  IFS=: read -r batch name flags <<< "$spec"
  KC_WORKER_ARGS="${flags:-}" KC_GPU=$i KC_CPUS="$((i * per))-$(((i + 1) * per - 1))" \
    bash scripts/gpu_measure_round.sh "$batch" "$name" "$budget" > "$OUT/round-$name.txt" 2>&1 &
  i=$((i + 1))
done
wait
for spec in "$@"; do IFS=: read -r _ name _ <<< "$spec"; echo "== $name"; cat "$OUT/round-$name.txt"; done
