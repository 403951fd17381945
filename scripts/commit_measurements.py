"""Put a GPU run's result files under data/measurements/<hardware>/ with the kernels they need.

The same as `python3 -m warehouse.commit`, whose docstring has the options; this
file keeps the commands written with the script's name working:

    python3 scripts/commit_measurements.py --name 2026-11-29-s3 --kernels .gpu-batches/main/kernels.parquet \
        [--kernels MORE_KERNELS.parquet ...] RESULTS.parquet [RESULTS.parquet ...]
"""

import os
import sys

# Run as a module, as the GPU host runs the worker: from the repository root the packages import
# without kernelcast being installed, and no import path is edited.
os.execv(sys.executable, [sys.executable, "-m", "warehouse.commit", *sys.argv[1:]])
