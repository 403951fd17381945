#!/usr/bin/env bash
# Here (with network): the Python 3.12 wheels a GPU host lacks to run the Dagster fan-out
# (`kernelcast measure`): Dagster and its needs, DuckDB and polars, at this venv's versions,
# into DIR (copy DIR to the host for scripts/gpu_fanout_check.sh --wheels DIR).
#
#   bash scripts/gpu_fanout_wheels.sh --out DIR [PYTHON=.venv/bin/python]
set -euo pipefail
if [ "${1:-}" != --out ] || [ -z "${2:-}" ]; then echo "usage: $0 --out DIR [PYTHON]" >&2; exit 2; fi
dir=$2; shift 2
py=${1:-.venv/bin/python}
NAMES=(polars-runtime-32 duckdb polars dagster dagster-pipes dagster-shared pydantic pydantic-core annotated-types
   typing-inspection typing-extensions sqlalchemy alembic mako antlr4-python3-runtime coloredlogs humanfriendly
   docstring-parser grpcio grpcio-health-checking protobuf python-dotenv pytz structlog tomli toposort tzdata
   universal-pathlib pathlib-abc fsspec watchdog platformdirs tomlkit)
pin() {  # NAME -> NAME==VERSION as installed here
  "$py" -m pip show "$1" 2>/dev/null | awk -v n="$1" '/^Version:/ {print n "==" $2}'
}
mkdir -p "$dir"
for name in "${NAMES[@]}"; do
  spec=$(pin "$name"); [ -n "$spec" ] || { echo "error: $name is not installed in $py"; exit 2; }
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$spec" 2>&1 | grep -v "^WARNING: Location" || true
done
du -sh "$dir"
