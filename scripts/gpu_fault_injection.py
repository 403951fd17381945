"""Fault injection for the profiling worker: broken and hostile kernels fail the right way.

The same as `python3 -m pipelines.profiling.fault_injection`, whose docstring has the options; this
file keeps the commands written with the script's name working:

    python3 scripts/gpu_fault_injection.py --out-dir DIR/fault              # on the H200
    python3 scripts/gpu_fault_injection.py --device cpu --out-dir /tmp/fi  # anywhere (interpreter)
"""

import os
import sys

# Run as a module, as the GPU host runs the worker: from the repository root the packages import
# without kernelcast being installed, and no import path is edited.
os.execv(sys.executable, [sys.executable, "-m", "pipelines.profiling.fault_injection", *sys.argv[1:]])
