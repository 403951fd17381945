"""Does this GPU's attention backward return NaN gradients on left-padded batches?

The same as `python3 -m models.training.gpu_host.sdpa_check`, whose docstring has the options; this
file keeps the commands written with the script's name working:

    python3 scripts/gpu_check_sdpa.py [--lengths 704,768,3136,3200] [--pad 1000]
"""

import os
import sys

# Run as a module, as the GPU host runs the worker: from the repository root the packages import
# without kernelcast being installed, and no import path is edited.
os.execv(sys.executable, [sys.executable, "-m", "models.training.gpu_host.sdpa_check", *sys.argv[1:]])
