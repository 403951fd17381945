"""The harness on the GPU: the same committed kernels under the kernelcast and gpumode protocols,
published GPU MODE TriMul submissions unmodified under both, and the hostile fault battery.

    python3 -m benchmarks.harness_bench --out OUT --deadline-s 1500     # on one H200
    python3 -m benchmarks.harness_bench --out /tmp/b --device cpu --n 4 --no-fault   # CPU dry run
    python3 -m benchmarks.harness_bench --out p1 --part 1/2 ...   # one half of the kernels,
    python3 -m benchmarks.harness_bench --out p2 --part 2/2 ...   # the other half,
    python3 -m benchmarks.harness_bench --out all --merge p1 p2   # one report of both

1. Draws --n committed kernels (default 100: 2 trimul, 12 or 13 of each other task) that an earlier
   H200 run measured correct, sources included (data/measurements/h200/kernels-*.parquet,
   benchmarks/protocol_bench.py), and adds every *.py of --submissions (published TriMul
   submissions, unmodified, task trimul) before the committed kernels, which go round-robin over
   tasks (a run cut short by its budget loses kernels of every task alike).
2. Runs the profiling worker on that batch under --protocol kernelcast and --protocol gpumode,
   within time budgets so the whole script fits --deadline-s: side by side on two GPUs when the
   host has them; on one GPU kernelcast first (--kernelcast-share of the budget), then gpumode
   on exactly the kernels kernelcast finished, so each kernel measured is measured under both.
   On one H200 on 2026-12-01 a worker took about 30 s to start and then measured 0.4-0.5
   kernels/s under either protocol: 100 kernels and six submissions need about 600 s, more than
   one run on a GPU host may last, so --part K/N measures every N-th kernel (submissions go
   with part 1) and --merge puts the parts' result files into one report.
3. Runs the fault battery (benchmarks/fault_injection.py: broken and hostile kernels) on
   the GPU; --no-fault skips it.
4. Writes into --out (7 files): results-kernelcast.parquet, results-gpumode.parquet (the committed
   kernels' rows, RESULT_SCHEMA, ingestable), submissions-kernelcast.parquet,
   submissions-gpumode.parquet (the third-party kernels' rows), fault-results.parquet,
   bench-batch.parquet (kernel id, task, origin; no sources) and bench-summary.json; prints a
   summary: per kernel the ratio kernelcast/gpumode of its time and of its speedup (median, p5,
   p95, overall and per task), each submission's outcome and GPU MODE score under both
   protocols, each fault kernel's failure kind, the sandbox layers, the throughput.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import protocol_bench as bench
from pipelines.profiling.sandbox_policy import REPO_ROOT
from warehouse.formats import RESULT_SCHEMA

FAULT_RESERVE_S = 75.0  # the fault battery: hangs time out at 15 s, in parallel compile children
PROTOCOLS = ("kernelcast", "gpumode")
KERNELCAST_SHARE = 0.5  # on one GPU: both protocols took 2-2.5 s a kernel on the H200


def _tee(cmd: list[str], env: dict, prefix: str) -> tuple[int, list[str]]:
    """Run `cmd`, copying its stderr to ours with a prefix; (exit code, stderr lines)."""
    p = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    for line in p.stderr:
        lines.append(line.rstrip("\n"))
        sys.stderr.write(f"[{prefix}] {line}")
    return p.wait(), lines


_PIN = "import os, sys; os.sched_setaffinity(0, set(map(int, sys.argv[1].split(',')))); os.execv(sys.argv[2], sys.argv[2:])"


def _pinned(cmd: list[str], cpus: list[int]) -> list[str]:
    """`cmd` confined to `cpus` (its children inherit them): two workers side by side must not
    put their measuring children on the same cores."""
    return [sys.executable, "-c", _PIN, ",".join(map(str, cpus)), *cmd]


def _gpus(requested: str, device: str) -> list[str]:
    if device != "cuda":
        return [""]
    if requested != "auto":
        return [g.strip() for g in requested.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return out or ["0"]


def _worker_cmd(batch: Path, out: Path, protocol: str, device: str, budget: float, workers: int,
                summary: Path, logs: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pipelines.profiling.worker", "--batch", str(batch), "--out", str(out),
           "--device", device, "--protocol", protocol, "--time-budget-s", f"{max(budget, 20.0):.0f}",
           "--compile-workers", str(workers), "--summary-json", str(summary), "--log-dir", str(logs)]
    return cmd + (["--max-reps", "3", "--timeout-s", "60"] if device == "cpu" else [])


def run_protocols(batch: Path, work: Path, device: str, gpus: list[str], budget: float,
                  share: float = KERNELCAST_SHARE) -> dict:
    """The worker under each protocol; {protocol: {"out", "exit", "sandbox", "summary"}}.

    With two GPUs the protocols run side by side on the whole batch. With one, kernelcast runs
    first on its share of the budget and gpumode then measures exactly the kernels kernelcast
    finished, in the rest: every kernel measured counts for the comparison.
    """
    cores = os.cpu_count() or 2
    parallel = device == "cuda" and len(gpus) >= 2
    cache = work / "triton-cache"  # shared: the second protocol's run finds every kernel compiled
    workers = max(1, (cores // 2 if parallel else cores) - 2) if device == "cuda" else 2
    runs: dict[str, dict] = {}

    all_cpus = sorted(os.sched_getaffinity(0))
    halves = [all_cpus[: len(all_cpus) // 2], all_cpus[len(all_cpus) // 2:]]

    def one(protocol: str, gpu: str, seconds: float, kernels: Path) -> None:
        out = work / f"raw-{protocol}.parquet"
        for stale in (out, out.with_name(out.name + ".partial.jsonl")):
            stale.unlink(missing_ok=True)
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = gpu
        summary = work / f"summary-{protocol}.json"
        t0 = time.monotonic()
        cmd = _worker_cmd(kernels, out, protocol, device, seconds, workers, summary, work / f"logs-{protocol}")
        if parallel:
            cmd = _pinned(cmd, halves[PROTOCOLS.index(protocol)])
        rc, lines = _tee(cmd, env, protocol)
        runs[protocol] = {
            "out": out, "exit": rc, "wall_s": time.monotonic() - t0, "gpu": gpu,
            "sandbox": next((ln for ln in lines if ln.startswith("sandbox: ")), None),
            "summary": json.loads(summary.read_text()) if summary.exists() else None,
            "error": next((ln for ln in reversed(lines) if ln.startswith("error: ")), None),
        }

    if parallel:
        threads = [threading.Thread(target=one, args=(p, gpus[i], budget, batch)) for i, p in enumerate(PROTOCOLS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        one("kernelcast", gpus[0], budget * share, batch)
        left = budget - runs["kernelcast"]["wall_s"]
        one("gpumode", gpus[0], left, _finished_batch(batch, runs["kernelcast"]["out"], work / "batch-gpumode.parquet"))
    return runs


def _finished_batch(batch: Path, out: Path, path: Path) -> Path:
    """The rows of `batch` whose kernels have a row in `out`, in batch order (the whole batch
    when `out` has none: the first run said why on stderr)."""
    if not out.exists():
        return batch
    done = set(pq.read_table(out, columns=["kernel_id"]).column("kernel_id").to_pylist())
    if not done:
        return batch
    table = pq.read_table(batch)
    pq.write_table(table.filter(pa.array([k in done for k in table.column("kernel_id").to_pylist()])), path)
    return path


def run_fault(work: Path, device: str, gpu: str, seconds: float) -> dict:
    out_dir = work / "fault"
    shutil.rmtree(out_dir, ignore_errors=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu) if device == "cuda" else dict(os.environ)
    cmd = [sys.executable, "-m", "benchmarks.fault_injection", "--device", device, "--out-dir",
           str(out_dir), "--good-copies", "2", "--timeout-s", "15"]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, text=True, capture_output=True, timeout=max(seconds, 30.0))
    except subprocess.TimeoutExpired:
        return {"exit": None, "error": f"the fault battery did not finish within {seconds:.0f} s", "dir": out_dir}
    report = json.loads((out_dir / "fault.json").read_text()) if (out_dir / "fault.json").exists() else {}
    return {"exit": proc.returncode, "report": report, "dir": out_dir, "tail": proc.stdout.splitlines()[-3:]}


def _write(table: pa.Table, path: Path) -> None:
    """The files this writes are the ones committed under data/: zstd, as every measurement there."""
    pq.write_table(table, path, compression="zstd")


def _rows(path: Path) -> tuple[pa.Table, pa.Table]:
    if not path.exists():  # the worker never got to write (it said why on stderr)
        return RESULT_SCHEMA.empty_table(), RESULT_SCHEMA.empty_table()
    return bench.split_rows(pq.read_table(path))


def _fmt(s: dict) -> str:
    if not s["n"]:
        return "no kernel correct under both"
    return f"median {s['median']:.3f}, p5 {s['p5']:.3f}, p95 {s['p95']:.3f} ({s['n']} kernels)"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the result files")
    ap.add_argument("--n", type=int, default=100, help="committed kernels to measure")
    ap.add_argument("--tasks", default=None, help="comma-separated tasks to draw from (default: all)")
    ap.add_argument("--data", default=str(REPO_ROOT / "data" / "measurements" / "h200"))
    ap.add_argument("--submissions", default=str(REPO_ROOT / ".gpumode-submissions"),
                    help="folder of published GPU MODE TriMul submissions (*.py); missing: none")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--gpus", default="auto", help="GPU indices to use (auto: all; two or more run the protocols side by side)")
    ap.add_argument("--deadline-s", type=float, default=285.0, help="the whole script, seconds")
    ap.add_argument("--no-fault", action="store_true")
    ap.add_argument("--part", default="1/1", type=_part,
                    help="K/N: measure every N-th drawn kernel from the K-th (submissions go with part 1)")
    ap.add_argument("--kernelcast-share", type=_share, default=KERNELCAST_SHARE,
                    help="on one GPU, the share of the budget kernelcast gets before gpumode (default %(default)s)")
    ap.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                    help="measure nothing: put the result files of these earlier --out folders into one report")
    ap.add_argument("--work-dir", default=None, help="logs and raw files (default: a folder beside --out)")
    return ap


def _part(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part wants K/N, such as 1/2, not {text!r}") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--part {text}: K must be between 1 and N")
    return k, n


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 < share < 1.0:
        raise argparse.ArgumentTypeError(f"--kernelcast-share wants a fraction between 0 and 1, not {text!r}")
    return share


def _batch(args: argparse.Namespace, work: Path, out: Path) -> tuple[list[dict], list[dict], Path]:
    """(committed kernels, submissions, the worker's batch file); bench-batch.parquet written."""
    tasks = [t.strip() for t in args.tasks.split(",")] if args.tasks else None
    k, n = args.part
    # Round-robin over tasks: what a time budget cuts is spread over the tasks, and so is a part.
    kernels = bench.interleave(bench.draw_kernels(args.data, args.n, tasks=tasks))[k - 1::n]
    subs = bench.submission_rows(args.submissions) if k == 1 and Path(args.submissions).is_dir() else []
    # Submissions first: few, and what the comparison cannot do without.
    batch = bench.write_batch(subs + kernels, work / "batch.parquet")
    _write(pa.Table.from_pylist([{"kernel_id": r["kernel_id"], "task": r["task"],
                                  "origin": "submission" if r in subs else "committed"}
                                 for r in kernels + subs]), out / "bench-batch.parquet")
    print(f"batch (part {k}/{n}): {len(kernels)} committed kernels, {len(subs)} GPU MODE submissions", file=sys.stderr)
    return kernels, subs, batch


def _throughput(runs: dict) -> dict:
    throughput = {}
    for p in PROTOCOLS:
        s = runs[p]["summary"] or {}
        if s.get("elapsed_s"):
            throughput[p] = {"measured": s.get("measured_now"), "elapsed_s": s["elapsed_s"],
                             "kernels_per_hour": 3600.0 * (s.get("measured_now") or 0) / s["elapsed_s"]}
    return throughput


def _print_report(summary: dict, out: Path) -> None:
    comparison, gpus, workers = summary["comparison"], summary["gpus"], summary["workers"]
    print(f"\n== kernelcast vs gpumode: {summary['kernels']} committed kernels ({summary['device']}, GPUs {','.join(gpus) or '-'})")
    for p in PROTOCOLS:
        t = summary["throughput"].get(p, {})
        print(f"  {p:<10} outcomes {comparison['status'].get(p, {})}; "
              f"{t.get('kernels_per_hour', 0):.0f} kernels/hour; exit {workers[p]['exit']}")
    print(f"  kernel time kernelcast/gpumode: {_fmt(comparison['time_ratio'])}")
    print(f"  speedup    kernelcast/gpumode: {_fmt(comparison['speedup_ratio'])}")
    for task, r in comparison["per_task"].items():
        print(f"    {task:<18} time {_fmt(r['time_ratio'])}")
    if comparison["disagree"]:
        print(f"  correct under one protocol only: {', '.join(k[:12] for k in comparison['disagree'])}")
    print("\n== published GPU MODE TriMul submissions (score: geomean of per-case mean time, us)")
    for s in summary["submission_results"]:
        cells = []
        for p in PROTOCOLS:
            r = s[p]
            cells.append(f"{p} {r['status']}" + (f" x{r['speedup']:.2f} {r['score_us']:.0f}us" if r["status"] == "ok"
                                                 else f" ({(r.get('error') or '')[:70]})"))
        print(f"  {s['submission']:<32} " + " | ".join(cells))
    fault = summary["fault"]
    if fault is not None:
        print("\n== fault injection on the GPU path")
        rows = (fault.get("report") or {}).get("rows", [])
        for r in rows:
            mark = "" if str(r["got"]) in r["accepted"] else "  <-- MISMATCH"
            print(f"  {r['kernel_id']:<34} {r['got']!s:<15} (accepted {'/'.join(r['accepted'])}){mark}")
        print(f"  outside the sandbox: {(fault.get('report') or {}).get('outside')}; exit {fault.get('exit')}"
              + (f"; {fault['error']}" if fault.get("error") else ""))
    for p in PROTOCOLS:
        if summary["sandbox"].get(p):
            print(f"\n{p}: {summary['sandbox'][p]}")
    print(f"\nwrote {', '.join(sorted(f.name for f in out.iterdir()))} into {out} in {summary['wall_s']:.0f} s")


def _write_tables(out: Path, tables: dict[str, tuple[pa.Table, pa.Table]]) -> None:
    """results-*/submissions-*.parquet into `out`."""
    for p in PROTOCOLS:
        committed, submitted = tables[p]
        _write(committed, out / f"results-{p}.parquet")
        _write(submitted, out / f"submissions-{p}.parquet")


def _compare(tables: dict[str, tuple[pa.Table, pa.Table]]) -> tuple[dict, list[dict]]:
    """(the comparison of the committed kernels, the submissions table)."""
    comparison = bench.compare(tables["kernelcast"][0].to_pylist(), tables["gpumode"][0].to_pylist())
    submissions = bench.submissions_table(tables["kernelcast"][1].to_pylist(), tables["gpumode"][1].to_pylist())
    return comparison, submissions


def merge(dirs: list[str], out: Path) -> int:
    """One report of several parts' --out folders (`--part K/N` runs): their result files put
    together, the comparison and submissions table computed over all of them. A kernel measured
    in two parts is refused: the parts of one draw are disjoint, and a later run of what a part
    did not reach adds rows only for those kernels. Everything is read and checked before
    anything is written. Exit code as a run's: 1 if a part's worker failed, 2 (one line) if the
    parts cannot be merged."""
    try:
        parts = [(d, _read_summary(d)) for d in map(Path, dirs)]
        tables = _merged_tables([d for d, _ in parts])
        # A kernel one part did not reach may be in a later part's batch too: the batch lists it once.
        batch = pa.concat_tables([pq.read_table(d / "bench-batch.parquet") for d, _ in parts])
        comparison, submissions = _compare(tables)
        summary = _merged_summary(parts, comparison, submissions)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
        print(f"error: cannot merge {' '.join(dirs)}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    first = {k: i for i, k in reversed(list(enumerate(batch.column("kernel_id").to_pylist())))}
    _write(batch.take(sorted(first.values())), out / "bench-batch.parquet")
    _write_tables(out, tables)
    (out / "bench-summary.json").write_text(json.dumps(summary, indent=2, default=str))
    _print_report(summary, out)
    return 0 if all(summary["workers"][p]["exit"] == 0 for p in PROTOCOLS) else 1


def _read_summary(folder: Path) -> dict:
    path = folder / "bench-summary.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a finished harness_bench folder (no bench-summary.json)")
    return json.loads(path.read_text())


def _merged_tables(dirs: list[Path]) -> dict[str, tuple[pa.Table, pa.Table]]:
    """{protocol: (committed rows, submissions' rows)} of all parts; ValueError if a kernel was
    measured in two of them."""
    tables = {}
    for p in PROTOCOLS:
        committed = pa.concat_tables([_rows(d / f"results-{p}.parquet")[0] for d in dirs])
        submitted = pa.concat_tables([_rows(d / f"submissions-{p}.parquet")[1] for d in dirs])
        ids = committed.column("kernel_id").to_pylist() + submitted.column("kernel_id").to_pylist()
        twice = sorted(k for k, c in collections.Counter(ids).items() if c > 1)
        if twice:
            raise ValueError(f"{len(twice)} kernels measured under {p} in more than one part (e.g. {twice[0]}): "
                             "merge the parts of one draw")
        tables[p] = (committed, submitted)
    return tables


def _merged_summary(parts: list[tuple[Path, dict]], comparison: dict, submissions: list[dict]) -> dict:
    summaries = [s for _, s in parts]
    throughput = {}
    for p in PROTOCOLS:
        got = [s["throughput"][p] for s in summaries if p in s["throughput"]]
        if got:
            measured, elapsed = sum(t["measured"] or 0 for t in got), sum(t["elapsed_s"] for t in got)
            throughput[p] = {"measured": measured, "elapsed_s": elapsed, "kernels_per_hour": 3600.0 * measured / elapsed}
    return {
        "device": summaries[0]["device"], "gpus": summaries[0]["gpus"], "wall_s": sum(s["wall_s"] for s in summaries),
        "kernels": sum(s["kernels"] for s in summaries), "parts": [d.name for d, _ in parts],
        "submissions": list(dict.fromkeys(k for s in summaries for k in s["submissions"])), "comparison": comparison,
        "submission_results": submissions, "throughput": throughput,
        "sandbox": {p: next((s["sandbox"][p] for s in summaries if s["sandbox"].get(p)), None) for p in PROTOCOLS},
        "workers": {p: {"exit": next((s["workers"][p]["exit"] for s in summaries if s["workers"][p]["exit"] != 0), 0),
                        "parts": [s["workers"][p] for s in summaries]} for p in PROTOCOLS},
        "fault": next((s["fault"] for s in summaries if s["fault"] is not None), None),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out).resolve())
    t_start = time.monotonic()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir or (out.parent / (out.name + "-work"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.chmod(work, 0o755)
    kernels, subs, batch = _batch(args, work, out)

    gpus = _gpus(args.gpus, args.device)
    reserve = 0.0 if args.no_fault else FAULT_RESERVE_S
    budget = args.deadline_s - (time.monotonic() - t_start) - reserve - 15.0  # 15 s: start-up and writing
    runs = run_protocols(batch, work, args.device, gpus, budget, args.kernelcast_share)
    tables = {p: _rows(runs[p]["out"]) for p in PROTOCOLS}
    _write_tables(out, tables)
    comparison, submissions = _compare(tables)

    fault = None
    if not args.no_fault:
        left = args.deadline_s - (time.monotonic() - t_start) - 5.0
        fault = run_fault(work, args.device, gpus[0], left)
        if (fault["dir"] / "results.parquet").exists():
            shutil.copy(fault["dir"] / "results.parquet", out / "fault-results.parquet")

    summary = {
        "device": args.device, "gpus": gpus, "wall_s": time.monotonic() - t_start, "kernels": len(kernels),
        "part": "/".join(map(str, args.part)),
        "submissions": [r["kernel_id"] for r in subs], "comparison": comparison, "submission_results": submissions,
        "throughput": _throughput(runs), "sandbox": {p: runs[p]["sandbox"] for p in PROTOCOLS},
        "workers": {p: {k: v for k, v in runs[p].items() if k not in ("out", "summary")} for p in PROTOCOLS},
        "fault": None if fault is None else {k: v for k, v in fault.items() if k != "dir"},
    }
    (out / "bench-summary.json").write_text(json.dumps(summary, indent=2, default=str))
    _print_report(summary, out)
    ok = all(runs[p]["exit"] == 0 for p in PROTOCOLS) and (fault is None or fault.get("exit") == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
