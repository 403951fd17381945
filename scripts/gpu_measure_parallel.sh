#!/usr/bin/env bash
# One measuring call on a host of one or more GPUs, through Dagster: `kernelcast measure` adds
# the batch's kernels, splits the unmeasured ones into one shard per GPU and runs one measuring
# step per GPU side by side (multiprocess executor, CUDA_VISIBLE_DEVICES per step); the ingest
# merges them. Results and summary.json land in DIR.
#
#   bash scripts/gpu_measure_parallel.sh --out DIR BATCH.parquet [GPUS=all] [LIMIT]
#
# Needs dagster, duckdb and polars beside torch/triton. A bare host with torch only runs the
# worker directly:
# python3 -m pipelines.profiling.worker --batch B --out O (docs/operating.md, "Measuring on a GPU host").
set -eu
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then echo "usage: $0 --out DIR BATCH.parquet [GPUS] [LIMIT]" >&2; exit 2; fi
out=$2; shift 2
exec python3 -m orchestration.cli measure --profile gpu --batch "$1" ${2:+--gpus "$2"} ${3:+--limit "$3"} \
  --out "$out"
