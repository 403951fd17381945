"""The harness on the GPU: committed kernels and GPU MODE submissions under two protocols.

The same as `python3 -m pipelines.profiling.harness_bench`, whose docstring has the options; this
file keeps the commands written with the script's name working:

    python3 scripts/gpu_harness_bench.py --out DIR                        # on the H200 host, ~5 min
    python3 scripts/gpu_harness_bench.py --out /tmp/b --device cpu --n 4 --no-fault   # CPU dry run
"""

import os
import sys

# Run as a module, as the GPU host runs the worker: from the repository root the packages import
# without kernelcast being installed, and no import path is edited.
os.execv(sys.executable, [sys.executable, "-m", "pipelines.profiling.harness_bench", *sys.argv[1:]])
