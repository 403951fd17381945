#!/usr/bin/env bash
# On a GPU host: the Dagster measuring fan-out (`kernelcast measure`, one step per GPU on the
# multiprocess executor) over a small batch of committed kernels, results in DIR.
#
#   bash scripts/gpu_fanout_check.sh --out DIR [--wheels WHEELS] [N_KERNELS=100] [GPUS=all]
#
# WHEELS: the folder of scripts/gpu_fanout_wheels.sh, for a host without Dagster, DuckDB and
# polars; they are installed into a site folder of this run only. It measures N_KERNELS of
# data/measurements/h200/kernels-2026-11-29-harness1.parquet (runs B and C measured them with harness 1;
# here the current harness measures them again) in a fresh home whose data folder is empty, so
# nothing counts as measured already. DIR gets results-gpu<i>.parquet, summary.json (steps,
# processes, counts, seconds) and the run's log.
set -u
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then echo "usage: $0 --out DIR [--wheels WHEELS] [N_KERNELS] [GPUS]" >&2; exit 2; fi
out=$2; shift 2
wheels=
if [ "${1:-}" = --wheels ]; then wheels=${2:?--wheels needs a folder}; shift 2; fi
n=${1:-100} gpus=${2:-}
work=$(mktemp -d /tmp/kc-fanout.XXXX)
mkdir -p "$out" "$work/data/measurements"
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$wheels"/*.whl || exit 1
fi
# unbuffered: a run stopped by a time limit still leaves what it printed
export PYTHONPATH=${wheels:+$work/site:}$PWD KERNELCAST_HOME=$work/home KERNELCAST_DATA=$work/data PYTHONUNBUFFERED=1
python3 -c "import dagster, duckdb, polars, torch; print('dagster', dagster.__version__, 'duckdb', duckdb.__version__, 'polars', polars.__version__, 'GPUs', torch.cuda.device_count())" || exit 1
set -o pipefail
python3 -m orchestration.cli measure --profile gpu --batch data/measurements/h200/kernels-2026-11-29-harness1.parquet \
  --limit "$n" ${gpus:+--gpus "$gpus"} --out "$out" 2>&1 | tee "$out/measure.txt"
rc=$?
cp "$work"/home/logs/measure-*.log "$out/" 2>/dev/null
python3 -m benchmarks.profiling throughput "$out"/results-gpu0.parquet 2>&1 | tail -4
exit $rc
