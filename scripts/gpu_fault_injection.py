"""Fault injection for the profiling worker: broken kernels must fail the right way, good ones get measured.

    python3 scripts/gpu_fault_injection.py --out-dir $OUT/fault            # on the H200
    python3 scripts/gpu_fault_injection.py --device cpu --out-dir /tmp/fi  # anywhere (interpreter)

Builds a batch of the kernels in tests/fixtures_kernels (task `tiny_scale`: y = 2x + 1): good
Triton and PyTorch kernels (several copies each, so compiles run in parallel) mixed with a
syntax error, a missing entry point, a Triton compile error, a wrong result, a result cached by
shape, a Python exception, endless loops in Python and in a Triton kernel, an out-of-bounds
store 1 TiB away (illegal memory access), os._exit and a segfault. Runs the worker as a
separate process (`python3 -m pipelines.profiling.worker`), then asserts: the worker exited 0
and wrote its file, every kernel got its expected failure kind (on CPU: one of the kinds the
interpreter can produce), and good kernels are ok with finite speedups. Prints a table; exits 1
on any mismatch. Worker logs and the result file stay in --out-dir.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures_kernels"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(FIXTURES))

from tiny_task import EXPECTED  # noqa: E402

from pipelines.profiling.formats import BATCH_SCHEMA, RESULT_SCHEMA  # noqa: E402

GOOD = ("good_triton.py", "good_torch.py")


def build_batch(path: Path, good_copies: int, skip: set[str]) -> dict[str, str]:
    """Write the batch; return kernel_id -> fixture file name."""
    rows, origin = [], {}
    for name in EXPECTED:
        if name in skip:
            continue
        source = (FIXTURES / name).read_text()
        copies = good_copies if name in GOOD else 1
        for i in range(copies):
            kid = f"{name.removesuffix('.py')}-{i}"
            rows.append({"kernel_id": kid, "task": "tiny_scale", "source": f"{source}\n# copy {i}\n"})
            origin[kid] = name
    pq.write_table(pa.Table.from_pylist(rows, schema=BATCH_SCHEMA), path)
    return origin


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out-dir", default="fault-injection")
    ap.add_argument("--timeout-s", type=float, default=None, help="worker --timeout-s (default 20 cuda, 8 cpu)")
    ap.add_argument("--good-copies", type=int, default=None, help="copies of each good kernel (default 8 cuda, 1 cpu)")
    ap.add_argument("--compile-workers", type=int, default=None)
    ap.add_argument("--skip", default="", help="comma-separated fixture files to leave out")
    ap.add_argument("--protocol", choices=("kernelcast", "paper"), default="kernelcast")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    timeout_s = args.timeout_s or (20.0 if cuda else 8.0)
    copies = args.good_copies or (8 if cuda else 1)
    workers = args.compile_workers or (max(1, min(14, (os.cpu_count() or 2) - 2)) if cuda else 2)

    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    batch, out = out_dir / "batch.parquet", out_dir / "results.parquet"
    for stale in (out, out.with_name(out.name + ".partial.jsonl")):
        stale.unlink(missing_ok=True)
    origin = build_batch(batch, copies, {s.strip() for s in args.skip.split(",") if s.strip()})

    env = dict(os.environ, KERNELCAST_TASK_MODULES=f"tiny_scale={FIXTURES / 'tiny_task.py'}")
    cmd = [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
           "--device", args.device, "--protocol", args.protocol, "--compile-workers", str(workers),
           "--timeout-s", str(timeout_s), "--log-dir", str(out_dir / "logs"),
           "--summary-json", str(out_dir / "summary.json")] + ([] if cuda else ["--max-reps", "3"])
    print("running:", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, check=False)
    wall = time.monotonic() - t0
    print(proc.stdout)

    problems = []
    if proc.returncode != 0:
        problems.append(f"worker exited {proc.returncode}")
    if not out.exists():
        print("FAIL: no result file", file=sys.stderr)
        return 1
    table = pq.read_table(out)
    if not table.schema.equals(RESULT_SCHEMA):
        problems.append("result schema differs from RESULT_SCHEMA")
    rows = {r["kernel_id"]: r for r in table.to_pylist()}
    print(f"{'kernel':<22} {'expected':<15} {'got':<15} {'speedup':>8}  {'s':>6}  error")
    for kid, name in origin.items():
        want_cuda, accepted = EXPECTED[name]
        accepted = (want_cuda,) if cuda else accepted
        r = rows.get(kid)
        if r is None:
            problems.append(f"{kid}: no row")
            print(f"{kid:<22} {want_cuda!s:<15} {'MISSING':<15}")
            continue
        got = None if r["status"] == "ok" else r["failure_kind"]
        secs = sum(x or 0.0 for x in (r["compile_s"], r["check_s"], r["time_s"]))
        sp = f"{r['speedup']:.3f}" if r["speedup"] else "-"
        mark = "" if got in accepted else "  <-- MISMATCH"
        print(f"{kid:<22} {want_cuda!s:<15} {got!s:<15} {sp:>8}  {secs:6.2f}  {(r['error'] or '')[:90]}{mark}")
        if got not in accepted:
            problems.append(f"{kid}: expected {accepted}, got {got} ({r['error']})")
        if got is None and not (r["speedup"] and math.isfinite(r["speedup"]) and r["speedup"] > 0):
            problems.append(f"{kid}: ok without a finite speedup")
    hw = next(iter(rows.values()))["hardware_id"] if rows else "?"
    print(f"\n{len(rows)}/{len(origin)} rows, hardware {hw}, worker wall {wall:.1f} s, exit {proc.returncode}")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("PASS: every kernel got its expected outcome and the worker survived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
