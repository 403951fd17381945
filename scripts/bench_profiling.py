"""Profiling benchmarks from result files: throughput, repeatability, protocol comparison.

The same as `python3 -m pipelines.profiling.benchmarks`, whose docstring has the options; this
file keeps the commands written with the script's name working:

    python3 scripts/bench_profiling.py throughput RUN.parquet [--summary RUN.summary.json]
    python3 scripts/bench_profiling.py compare RUN.parquet REPEAT.parquet
"""

import os
import sys

# Run as a module, as the GPU host runs the worker: from the repository root the packages import
# without kernelcast being installed, and no import path is edited.
os.execv(sys.executable, [sys.executable, "-m", "pipelines.profiling.benchmarks", *sys.argv[1:]])
