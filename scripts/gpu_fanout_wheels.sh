#!/usr/bin/env bash
# Here (with network): the Python 3.12 wheels the GPU host lacks to run the Dagster fan-out
# (`kernelcast measure`): Dagster and its needs, DuckDB and polars, at this venv's versions.
# polars' runtime alone is 54 MB, so they travel in two halves, one call each (a call carries at
# most 64 MiB with the working tree): .gpu-carry/fanout-a (polars-runtime-32) and
# .gpu-carry/fanout-b (the rest, ~40 MB). .gpu-carry/ is git-ignored.
#
#   bash scripts/gpu_fanout_wheels.sh [PYTHON=.venv/bin/python]
set -euo pipefail
py=${1:-.venv/bin/python}
A=(polars-runtime-32)
B=(duckdb polars dagster dagster-pipes dagster-shared pydantic pydantic-core annotated-types typing-inspection
   typing-extensions sqlalchemy alembic mako antlr4-python3-runtime coloredlogs humanfriendly docstring-parser
   grpcio grpcio-health-checking protobuf python-dotenv pytz structlog tomli toposort tzdata universal-pathlib
   pathlib-abc fsspec watchdog platformdirs tomlkit)
pin() {  # NAME -> NAME==VERSION as installed here
  "$py" -m pip show "$1" 2>/dev/null | awk -v n="$1" '/^Version:/ {print n "==" $2}'
}
fetch() {  # DIR NAME...
  local dir=$1; shift
  mkdir -p "$dir"
  for name in "$@"; do
    spec=$(pin "$name"); [ -n "$spec" ] || { echo "error: $name is not installed in $py"; exit 2; }
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$spec" 2>&1 | grep -v "^WARNING: Location" || true
  done
}
rm -rf .gpu-carry/fanout-a .gpu-carry/fanout-b
fetch .gpu-carry/fanout-a "${A[@]}"
fetch .gpu-carry/fanout-b "${B[@]}"
du -sh .gpu-carry/fanout-a .gpu-carry/fanout-b
