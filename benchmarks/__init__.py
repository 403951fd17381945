"""Benchmarks, demos and fuzzers of kernelcast: runnable measurements of the product, never part of it.

Each module is a command, run from the repository root as `python3 -m benchmarks.<name> --help`
(README.md in this folder lists them). The product packages never import from here
(tests/test_import_structure.py puts this folder above every floor); the ones a bare GPU host runs
need only the worker's stack (the standard library, numpy, torch, triton, pyarrow).
"""
