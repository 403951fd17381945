"""The worker's labels against an independent timing of the same files: Triton's `do_bench`.

    python3 -m benchmarks.independent_timing time BATCH.parquet --out independent.jsonl
        [--ids ids.txt] [--limit N] [--per-kernel-s 120] [--budget-s 300] [--parallel 1]
    python3 -m benchmarks.independent_timing compare RESULTS.parquet independent.jsonl [--names names.json]
        [--out comparison.json]

`time` (on a GPU host) runs each kernel of a kernel batch in a process of its own, as a plain
program would: the module imported, `custom_kernel` called on each benchmark case's input
(`task.generate_input`), timed by `triton.testing.do_bench` (CUDA events around each call, L2
flushed before it, the median of its calls; an autotuner tunes in the first call, as in any
program). The task's reference is timed the same way once per task. Nothing of the worker's
timing is used: not its feed, cover, flush, verifier or statistic. Correctness is the worker's
business; this only times. With `--parallel N`, N processes start at once, but each takes a
lock on the GPU before its first GPU work (inputs, compile-on-first-call, timing): only the
interpreter's start and the imports overlap, so the GPU still runs one program at a time.

`compare` (anywhere) puts each kernel's worker label (`speedup`, and `program_speedup` where the
row has it) beside the independent speedup: bins (docs/method.md), the median |log2 ratio|, and
every kernel whose two figures are more than 1.5x apart, with the row's host and device times per
case so a disagreement can be explained.

Only the standard library, numpy, torch, triton and pyarrow: it runs on a bare GPU host.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import geometric_mean

import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.bin_edges import checked_speedups, table_bins

DISAGREE = 1.5  # two speedups further apart than this are listed, to be explained
LOCK_ENV = "KERNELCAST_INDEPENDENT_GPU_LOCK"  # the file whose lock a timing process holds on the GPU


def _time_one(task_name: str, source_path: str | None) -> dict:
    """In this process: the median do_bench time (ms) of each benchmark case of `task_name`'s
    reference (no source) or of the kernel at `source_path`."""
    import torch
    from triton.testing import do_bench

    from pipelines.profiling.inputs import generate
    from pipelines.profiling.kernel_loading import load_kernel
    from pipelines.profiling.taskload import load_task

    task = load_task(task_name)
    with _gpu_lock():
        # a module that asks the device at import does so under the lock, like everything after it
        fn = task.ref_kernel if source_path is None else load_kernel(source_path, task)
        case_ids, times = [], []
        for case in task.benchmark_cases:
            data = generate(task, case)
            torch.cuda.synchronize()
            times.append(float(do_bench(lambda d=data: fn(d), warmup=25, rep=100, return_mode="median")))
            case_ids.append(task.case_id(case))
            del data
    return {"case_ids": case_ids, "ms": times}


@contextlib.contextmanager
def _gpu_lock():
    """Hold the batch's GPU lock (an exclusive flock on LOCK_ENV's file) where one is set."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _child(task_name: str, source: str | None, timeout_s: float, lock: str | None = None) -> dict:
    """`_time_one` in a child process (a kernel that hangs or crashes takes only its own row)."""
    with tempfile.TemporaryDirectory(prefix="kc-independent-") as tmp:
        path = None
        if source is not None:
            path = Path(tmp) / "kernel.py"
            path.write_text(source, encoding="utf-8")
        cmd = [sys.executable, "-m", "benchmarks.independent_timing", "_one", task_name] + ([str(path)] if path else [])
        try:
            env = {**os.environ, **({LOCK_ENV: lock} if lock else {})}
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return {"error": f"exit {done.returncode}: {tail[:300]}"}
        return json.loads(lines[-1])


def time_batch(batch: str, out: str, ids: set[str] | None, limit: int | None, per_kernel_s: float,
               budget_s: float, parallel: int = 1) -> int:
    """Time the batch's kernels (and each task's reference once, first) into `out` (JSON lines).

    `parallel` processes at a time, taking turns on the GPU (`_gpu_lock`); the budget stops new
    kernels from starting, those running finish."""
    rows = pq.read_table(batch, columns=["kernel_id", "task", "source"]).to_pylist()
    if ids is not None:
        rows = [r for r in rows if r["kernel_id"] in ids]
    rows = rows[:limit] if limit else rows
    start, refs, done = time.monotonic(), {}, 0
    with tempfile.TemporaryDirectory(prefix="kc-independent-lock-") as tmp, open(out, "w", encoding="utf-8") as f:
        lock = str(Path(tmp) / "gpu.lock") if parallel > 1 else None
        for task_name in dict.fromkeys(r["task"] for r in rows):
            refs[task_name] = _child(task_name, None, per_kernel_s)
            f.write(json.dumps({"reference": task_name, **refs[task_name]}) + "\n")

        def one(r: dict) -> dict | None:
            if time.monotonic() - start > budget_s:
                return None
            return {"kernel_id": r["kernel_id"], "task": r["task"], **_child(r["task"], r["source"], per_kernel_s, lock)}

        with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
            for line in pool.map(one, rows):
                if line is None:
                    continue
                ref, got = refs[line["task"]], line
                if "ms" in got and "ms" in ref and got["case_ids"] == ref["case_ids"]:
                    ratios = [a / b for a, b in zip(ref["ms"], got["ms"], strict=True)]
                    line["speedup"] = geometric_mean(ratios)
                    line["ref_ms"] = ref["ms"]
                f.write(json.dumps(line) + "\n")
                f.flush()
                done += 1
                print(f"{done}/{len(rows)} {line['task']} {line['kernel_id'][:12]} "
                      f"{line.get('speedup', line.get('error', '?'))}", flush=True)
        if done < len(rows):
            print(f"budget of {budget_s:.0f} s spent: {done} of {len(rows)} kernels timed", flush=True)
    return 0


def compare(results: str, independent: str, names: dict[str, str] | None = None) -> dict:
    """The worker's ok rows beside the independent speedups of the same kernels."""
    table = pq.read_table(results).to_pylist()
    rows = {r["kernel_id"]: r for r in table if r["status"] == "ok"}
    timed = [json.loads(ln) for ln in Path(independent).read_text(encoding="utf-8").splitlines() if ln.strip()]
    timed = [t for t in timed if "speedup" in t and t.get("kernel_id") in rows]
    pairs, far = [], []
    for t in timed:
        row = rows[t["kernel_id"]]
        label, program = float(row["speedup"]), row.get("program_speedup")
        ratio = abs(math.log2(label / t["speedup"]))
        bins = table_bins(checked_speedups([label, t["speedup"]]))
        entry = {"kernel_id": t["kernel_id"], "task": t["task"], "name": (names or {}).get(t["kernel_id"]),
                 "worker": label, "worker_program": program, "independent": t["speedup"],
                 "same_bin": bool(bins[0] == bins[1]), "log2_ratio": ratio,
                 "launch_bound": row.get("launch_bound")}
        pairs.append(entry)
        if max(label, t["speedup"]) / min(label, t["speedup"]) > DISAGREE:
            far.append({**entry, "case_ids": row["case_ids"], "kernel_device_ms": row["kernel_median_ms"],
                        "kernel_host_ms": row.get("kernel_host_ms"), "ref_device_ms": row["ref_median_ms"],
                        "ref_host_ms": row.get("ref_host_ms"), "independent_ms": t["ms"],
                        "independent_ref_ms": t.get("ref_ms"), "autotune": row.get("autotune_json")})
    ratios = sorted(p["log2_ratio"] for p in pairs)
    return {
        "kernels": len(pairs),
        "same_bin": sum(p["same_bin"] for p in pairs),
        "median_abs_log2_ratio": ratios[len(ratios) // 2] if ratios else None,
        "over_1_5x": far,
        "pairs": pairs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time", help="time a kernel batch with do_bench (GPU host)")
    t.add_argument("batch")
    t.add_argument("--out", required=True)
    t.add_argument("--ids", help="a file of kernel ids, one per line: only these")
    t.add_argument("--limit", type=int)
    t.add_argument("--per-kernel-s", type=float, default=120.0)
    t.add_argument("--budget-s", type=float, default=300.0)
    t.add_argument("--parallel", type=int, default=1,
                   help="processes at once; they take turns on the GPU, only start-up and imports overlap")
    c = sub.add_parser("compare", help="worker results beside the independent timing")
    c.add_argument("results")
    c.add_argument("independent")
    c.add_argument("--names", help="JSON {kernel_id: name}")
    c.add_argument("--out")
    one = sub.add_parser("_one")  # internal: one timing in this process
    one.add_argument("task")
    one.add_argument("path", nargs="?")
    args = ap.parse_args(argv)
    if args.cmd == "_one":
        print(json.dumps(_time_one(args.task, args.path)))
        return 0
    if args.cmd == "time":
        try:
            ids = set(Path(args.ids).read_text().split()) if args.ids else None
            return time_batch(args.batch, args.out, ids, args.limit, args.per_kernel_s, args.budget_s, args.parallel)
        except (OSError, pa.ArrowException) as exc:
            print(f"cannot time {args.batch}: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
    try:
        names = json.loads(Path(args.names).read_text()) if args.names else None
        report = compare(args.results, args.independent, names)
    except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
        print(f"cannot compare: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    print(f"{report['kernels']} kernels: {report['same_bin']} in the same bin, median |log2 ratio| "
          f"{report['median_abs_log2_ratio']}, {len(report['over_1_5x'])} more than {DISAGREE}x apart")
    for d in report["over_1_5x"]:
        print(f"  {d['task']} {d['name'] or d['kernel_id'][:12]}: worker {d['worker']:.3g}x "
              f"(program {d['worker_program']}), independent {d['independent']:.3g}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
