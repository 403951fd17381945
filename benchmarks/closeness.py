"""Time allclose_check's torch ops against its fused pass (pipelines/tasks/closeness.py) on the
tasks' own output shapes and dtypes, side by side on the same tensors:

    python3 -m benchmarks.closeness [--reps 20] [--tasks softmax,cross_entropy]

(as a module from the repository root, so the packages import on a GPU host where kernelcast is
not installed).

On a CUDA machine: every benchmark case of every task; each tensor of the reference's output on
that case's input is compared with a copy of itself (a passing verdict, the usual one). Prints ms
per call of each way (median of --reps, the host sync included, as the verifier pays it), their
ratio (torch / fused), the fused pass's read bandwidth (both tensors' bytes / time) and its first call in this
process (compile, or load from Triton's cache). Without CUDA: the Triton interpreter on the
tasks' small correctness cases, where the timings say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from pipelines.tasks import all_tasks, closeness  # noqa: E402
from pipelines.tasks.contract import allclose_check  # noqa: E402

RTOL = ATOL = 1e-2  # the time does not depend on the tolerances


def _ms_per_call(output, expected, fused: bool, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        allclose_check(output, expected, RTOL, ATOL, fused=fused)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20 if CUDA else 3)
    ap.add_argument("--tasks", default="", help="comma-separated task names (default: all)")
    args = ap.parse_args()
    wanted = set(filter(None, args.tasks.split(",")))
    if CUDA:
        print(f"device: {torch.cuda.get_device_name()}; ms per call, median of {args.reps}")
    else:
        print("no CUDA: the Triton interpreter on the correctness cases; these timings say "
              "nothing about a GPU")
    print(f"{'task':18} {'output':34} {'torch ms':>9} {'fused ms':>9} {'ratio':>6} {'GB/s':>7} "
          f"same  case")
    first_call = True
    for task in all_tasks():
        if wanted and task.name not in wanted:
            continue
        for case in task.benchmark_cases if CUDA else task.correctness_cases:
            data = task.generate_input(**case)
            expected = task.ref_kernel(data)
            outputs = expected if isinstance(expected, (tuple, list)) else (expected,)
            for i, exp in enumerate(outputs):
                if not (isinstance(exp, torch.Tensor) and exp.is_floating_point()):
                    continue
                out = exp.clone()
                label = f"[{i}] {tuple(exp.shape)} {str(exp.dtype).removeprefix('torch.')}"
                if not closeness.supports(out, exp):
                    print(f"{task.name:18} {label:34} torch ops only (the fused pass takes "
                          f"row-major contiguous tensors)  {task.case_id(case)}")
                    continue
                t0 = time.perf_counter()
                fused_verdict = allclose_check(out, exp, RTOL, ATOL, fused=True)
                if first_call:
                    print(f"first fused call in this process: {(time.perf_counter() - t0) * 1e3:.0f} ms")
                    first_call = False
                torch_verdict = allclose_check(out, exp, RTOL, ATOL, fused=False)
                torch_ms = _ms_per_call(out, exp, False, args.reps)
                fused_ms = _ms_per_call(out, exp, True, args.reps)
                gbps = 2 * exp.numel() * exp.element_size() / (fused_ms * 1e-3) / 1e9
                same = "yes" if fused_verdict == torch_verdict else "NO"
                print(f"{task.name:18} {label:34} {torch_ms:9.3f} {fused_ms:9.3f} "
                      f"{torch_ms / fused_ms:6.1f} {gbps:7.0f} {same:4}  {task.case_id(case)}")
            del data, expected, outputs
            if CUDA:
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
