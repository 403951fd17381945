#!/usr/bin/env bash
# On the GPU host: the Dagster measuring fan-out (`kernelcast measure`, one step per GPU on the
# multiprocess executor) over a small batch of committed kernels, results in $OUT.
# Wheels: scripts/gpu_fanout_wheels.sh here first. Two calls on one warm host, right after
# each other (each brings one half of the wheels; /root keeps the first half for the second):
#
#   on the host, with .gpu-carry/fanout-a copied there:  bash scripts/gpu_fanout_check.sh stage
#   then, with .gpu-carry/fanout-b copied there (same host):  bash scripts/gpu_fanout_check.sh run [N_KERNELS=100] [GPUS=all]
#
# `run` measures N_KERNELS of data/measurements/h200/kernels-2026-11-29.parquet (runs B and C
# measured them with harness 1; here harness 2 measures them again) in a fresh home whose data
# folder is empty, so nothing counts as measured already. $OUT gets results-gpu<i>.parquet,
# summary.json (steps, processes, counts, seconds) and the run's log.
set -u
site=/root/kc-site
case "${1:-}" in
  stage)
    mkdir -p "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu-carry/fanout-a/*.whl \
      && echo "staged $(ls .gpu-carry/fanout-a | wc -l) wheel(s) in $site" ;;
  run)
    n=${2:-100} gpus=${3:-}
    out=${OUT:?set OUT to the output folder}
    [ -d "$site/polars_runtime_32" ] || [ -d "$site/_polars_runtime_32" ] || { echo "error: run 'stage' first (call 1)"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu-carry/fanout-b/*.whl || exit 1
    # unbuffered: a run stopped by a time limit still leaves what it printed
    export PYTHONPATH=$site:$PWD KERNELCAST_HOME=/tmp/kc-fanout/home KERNELCAST_DATA=/tmp/kc-fanout/data PYTHONUNBUFFERED=1
    rm -rf /tmp/kc-fanout && mkdir -p /tmp/kc-fanout/data/measurements
    python3 -c "import dagster, duckdb, polars, torch; print('dagster', dagster.__version__, 'duckdb', duckdb.__version__, 'polars', polars.__version__, 'GPUs', torch.cuda.device_count())" || exit 1
    set -o pipefail
    python3 -m orchestration.cli measure --profile gpu --batch data/measurements/h200/kernels-2026-11-29.parquet \
      --limit "$n" ${gpus:+--gpus "$gpus"} --out "$out" 2>&1 | tee "$out/measure.txt"
    rc=$?
    cp /tmp/kc-fanout/home/logs/measure-*.log "$out/" 2>/dev/null
    python3 scripts/bench_profiling.py throughput "$out"/results-gpu0.parquet 2>&1 | tail -4
    exit $rc ;;
  *) echo "usage: $0 stage | run [N_KERNELS] [GPUS]"; exit 2 ;;
esac
