#!/usr/bin/env bash
# One measuring call on a host of several GPUs: one worker per GPU, each on its own batch and
# its own share of the CPU cores, all under the same time budget. Results land in $OUT as
# scripts/gpu_measure_round.sh writes them, one NAME per GPU.
#
#   bash scripts/gpu_measure_parallel.sh BUDGET_S BATCH_0:NAME_0 [BATCH_1:NAME_1 ...]
#
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
  batch=${spec%%:*} name=${spec##*:}
  KC_GPU=$i KC_CPUS="$((i * per))-$(((i + 1) * per - 1))" \
    bash scripts/gpu_measure_round.sh "$batch" "$name" "$budget" > "$OUT/round-$name.txt" 2>&1 &
  i=$((i + 1))
done
wait
for spec in "$@"; do echo "== ${spec##*:}"; cat "$OUT/round-${spec##*:}.txt"; done
