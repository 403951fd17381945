"""Fuzz benchmark of the answer parser (models.parsing): crashes, outcomes and time against length.

The same as `python3 -m models.parse_fuzz`, whose docstring has the options; this
file keeps the commands written with the script's name working:

    .venv/bin/python scripts/parse_fuzz_bench.py [--n 10000] [--seed 0] [--max-chars 8000] [--json]
"""

import os
import sys

# Run as a module, as the GPU host runs the worker: from the repository root the packages import
# without kernelcast being installed, and no import path is edited.
os.execv(sys.executable, [sys.executable, "-m", "models.parse_fuzz", *sys.argv[1:]])
