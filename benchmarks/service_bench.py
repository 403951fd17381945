"""The measuring service on one GPU: a live search to its full budget, then identical code.

    python3 -m benchmarks.service_bench --out OUT [--tasks softmax,rms_norm,layer_norm]
        [--seeds 2] [--budget 12] [--forecaster-file F.pkl] [--identical-tasks ...]
        [--protocols kernelcast,gpumode] [--compile-workers 12] [--deadline-s 270] [--device cuda|cpu]

1. Starts the measuring service (pipelines/profiling/service.py, protocol kernelcast) on a
   queue of its own under OUT and waits until its measuring child is ready (start-up paid once).
2. Identical code under kernelcast: per task a kernel that imports the reference and returns
   its result (protocol_bench.identical_code_rows), through the same service.
3. The live search (pipelines.search.live, --service on): every task x mode (standard,
   filtered) x seed, each run until its full measurement budget (or --deadline-s).
4. Stops the service; for each further protocol (gpumode, paper) starts one of that protocol
   and measures identical code again.
5. Writes OUT/service-bench.json: per run whether it reached its budget and its best speedup,
   per protocol and task the identical code's speedup (and whether it is within 2% of 1), the
   service's per-phase split, start-up, and kernels (and correct kernels) per hour of the
   measuring calls; beside it the live search's files (live-search.json, results-live.parquet,
   kernels-live.parquet), the identical-code rows (identical-<protocol>.json) and the services'
   logs.

The filtered mode's forecaster: --forecaster-file (a pickled object with predict_kernels, e.g.
`kernelcast export-forecaster`'s portable cost model, which needs pandas on the host), else the
bin prior of the committed H200 measurements (data/measurements/h200/results-*.parquet, read with
pyarrow): it needs nothing but numpy on the host, but it is constant per task, so filtering with
it is a random choice among the candidates (the JSON names the forecaster).

Imports the standard library, numpy and pyarrow here; torch and triton only in the service's
children (no polars, duckdb, dagster or mlflow: a bare GPU host).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipelines.profiling import service_queue as sq

REPO = Path(__file__).resolve().parents[1]
IDENTICAL_TOLERANCE = 0.02


def bin_prior_forecaster(folder: Path):
    """The bin prior (pipelines.forecasting.references.BinPriorForecaster) of the committed results' correct kernelcast
    rows, per task, Laplace-smoothed; None when the folder holds none."""
    from models.bins import NUM_BINS, speedup_to_bin
    from pipelines.forecasting.base import checked_probs
    from pipelines.forecasting.references import BinPriorForecaster

    counts: dict[str | None, np.ndarray] = {None: np.zeros(NUM_BINS)}
    for path in sorted(Path(folder).glob("results-*.parquet")):
        t = pq.read_table(path, columns=["task", "status", "protocol", "speedup"]).to_pylist()
        for r in t:
            s = r["speedup"]
            if r["status"] == "ok" and r["protocol"] == "kernelcast" and s is not None and s > 0 and math.isfinite(s):
                b = speedup_to_bin(s) - 1
                counts.setdefault(r["task"], np.zeros(NUM_BINS))[b] += 1
                counts[None][b] += 1
    if counts[None].sum() == 0:
        return None
    return BinPriorForecaster({t: checked_probs([(c + 1.0) / (c.sum() + NUM_BINS)], 1)[0] for t, c in counts.items()})


class Service:
    """A measuring service subprocess on its own queue."""

    def __init__(self, queue: Path, log: Path, device: str, protocol: str, compile_workers: int, ref_cache: Path,
                 extra: list[str]):
        self.queue, self.log, self.protocol = queue, log, protocol
        self.device = device
        self.fh = open(log, "w", encoding="utf-8")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.profiling.service", "--queue", str(queue), "--device", device,
             "--protocol", protocol, "--compile-workers", str(compile_workers), "--ref-cache", str(ref_cache), *extra],
            cwd=REPO, stdout=self.fh, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 300.0) -> float:
        """Seconds until the measuring child was ready (the service's start-up)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.protocol} service exited {self.proc.returncode}: {self._tail()}")
            st = self.status()
            if st.get("running") and st.get("state") == "ready":
                return time.monotonic() - self.t0
            time.sleep(0.2)
        raise RuntimeError(f"the {self.protocol} service was not ready within {timeout_s:.0f} s: {self._tail()}")

    def status(self) -> dict:
        from pipelines.profiling.service import status

        return status(self.queue, self.device)

    def stop(self, wait_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            try:
                sq.request_stop(self.queue, self.device)
            except sq.ServiceError:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.fh.close()
        return self.proc.returncode

    def _tail(self) -> str:
        self.fh.flush()
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no output"


def identical_rows(tasks: list[str], copies: int) -> list[dict]:
    from benchmarks.protocol_bench import identical_code_rows

    rows = []
    for r in identical_code_rows(tasks):
        for i in range(copies):
            rows.append({**r, "kernel_id": f"{r['kernel_id']}:{i}", "source": r["source"] + f"\n# copy {i}\n"})
    return rows


def identical_summary(rows: list[dict]) -> dict:
    """Per task: each copy's speedup and case speedups, and whether every copy is within 2% of 1."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["task"], {"speedups": [], "case_speedups": [], "failed": []})
        if r["status"] == "ok":
            t["speedups"].append(r["speedup"])
            t["case_speedups"].append(r["case_speedups"])
        else:
            t["failed"].append(f"{r['failure_kind']}: {r['error']}")
    for t in out.values():
        t["within_2pct"] = bool(t["speedups"]) and not t["failed"] and all(
            abs(s - 1.0) <= IDENTICAL_TOLERANCE for s in t["speedups"])
    return out


def _measure_identical(service: Service, rows: list[dict], out: Path, timeout_s: float) -> dict:
    t0 = time.monotonic()
    try:
        got = sq.submit(rows, queue=service.queue, device=service.device, protocol=service.protocol, timeout_s=timeout_s)
    except sq.ServiceError as e:
        return {"error": str(e)}
    (out / f"identical-{service.protocol}.json").write_text(json.dumps(got, indent=1, default=str))
    return {"seconds": round(time.monotonic() - t0, 1), "by_task": identical_summary(got)}


def _service_numbers(status: dict) -> dict:
    keys = ("ready_after_s", "measured", "ok", "failed", "phases_s", "ref_cache", "kernels_per_hour_since_ready",
            "correct_per_hour_since_ready", "hardware_id", "children_started")
    return {k: status.get(k) for k in keys}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.service_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--tasks", default="softmax,rms_norm,layer_norm")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--budget", type=int, default=12, help="measurements per live-search run (the root aside)")
    ap.add_argument("--forecaster-file", default=None, help="the filtered mode's forecaster (default: the committed bin prior)")
    ap.add_argument("--measurements", default=str(REPO / "data" / "measurements" / "h200"),
                    help="committed results the bin prior is made of")
    ap.add_argument("--identical-tasks", default="softmax,rms_norm,layer_norm,trimul")
    ap.add_argument("--identical-copies", type=int, default=1)
    ap.add_argument("--protocols", default="kernelcast,gpumode", help="identical code under each (kernelcast first)")
    ap.add_argument("--compile-workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--deadline-s", type=float, default=270.0,
                    help="start no new live-search round this long after the start (the gpumode service follows)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or protocols[0] != "kernelcast":
        print("error: --protocols must start with kernelcast (the live search's protocol)", file=sys.stderr)
        return 2
    extra = ["--max-reps", "3"] if args.device == "cpu" else []
    ref_cache = out / "reference-timings.json"
    forecaster_file = args.forecaster_file
    forecaster_label = f"file:{forecaster_file}" if forecaster_file else None
    if forecaster_file is None:
        prior = bin_prior_forecaster(Path(args.measurements))
        if prior is not None:
            forecaster_file = str(out / "bin-prior.pkl")
            with open(forecaster_file, "wb") as fh:
                pickle.dump(prior, fh)
            forecaster_label = "bin-prior (committed H200 results; constant per task)"
    report: dict = {"device": args.device, "tasks": args.tasks.split(","), "seeds": args.seeds, "budget": args.budget,
                    "forecaster": forecaster_label or "uniform", "protocols": protocols, "identical": {}, "services": {}}
    identical = identical_rows([t for t in args.identical_tasks.split(",") if t], args.identical_copies)
    code = 0
    svc = Service(out / "queue-kernelcast", out / "service-kernelcast.log", args.device, "kernelcast",
                  args.compile_workers, ref_cache, extra)
    try:
        report["services"]["kernelcast"] = {"ready_s": round(svc.wait_ready(), 1)}
        report["identical"]["kernelcast"] = _measure_identical(svc, identical, out, 600.0)
        before = svc.status()
        from pipelines.search import live

        live_args = ["--tasks", args.tasks, "--modes", "standard,filtered", "--seeds", str(args.seeds),
                     "--budget", str(args.budget), "--device", args.device, "--workdir", str(out / "live-work"),
                     "--out", str(out / "live"), "--service", "on", "--queue", str(svc.queue),
                     "--deadline-s", str(max(1.0, args.deadline_s - (time.monotonic() - t_start)))]
        live_args += ["--forecaster-file", forecaster_file] if forecaster_file else ["--forecaster", "uniform"]
        t_live = time.monotonic()
        live_rc = live.main(live_args)
        report["live_wall_s"] = round(time.monotonic() - t_live, 1)
        after = svc.status()
        report["services"]["kernelcast"].update(_service_numbers(after))
        report["live"] = _live_summary(out / "live" / "live-search.json", before, after)
        report["live"]["exit_code"] = live_rc
    except (RuntimeError, OSError, ValueError) as e:
        report["error"] = str(e).splitlines()[0]
        code = 1
    finally:
        report["services"].setdefault("kernelcast", {})["exit_code"] = svc.stop()
    for protocol in protocols[1:]:
        if code:
            break
        svc = Service(out / f"queue-{protocol}", out / f"service-{protocol}.log", args.device, protocol,
                      args.compile_workers, ref_cache, extra)
        try:
            report["services"][protocol] = {"ready_s": round(svc.wait_ready(), 1)}
            report["identical"][protocol] = _measure_identical(svc, identical, out, 600.0)
            report["services"][protocol].update(_service_numbers(svc.status()))
        except RuntimeError as e:
            report["services"][protocol] = {"error": str(e).splitlines()[0]}
        finally:
            report["services"][protocol]["exit_code"] = svc.stop()
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    report["identical_within_2pct"] = {p: {t: v["within_2pct"] for t, v in r.get("by_task", {}).items()}
                                       for p, r in report["identical"].items()}
    (out / "service-bench.json").write_text(json.dumps(report, indent=1, default=str))
    runs = report.get("live", {}).get("runs", [])
    reached = sum(r["budget_reached"] for r in runs)
    print(f"live search: {reached}/{len(runs)} runs reached their budget of {args.budget}; "
          f"identical code within 2%: {report['identical_within_2pct']}; {report['wall_s']:.0f} s "
          f"-> {out / 'service-bench.json'}", file=sys.stderr)
    return code or (0 if runs and reached == len(runs) else 3)


def _live_summary(path: Path, before: dict, after: dict) -> dict:
    """Per run: budget reached, measurements, best speedup; the live search's measuring rate and
    the service's per-phase split over the live search (after minus before)."""
    if not path.exists():
        return {"error": "no live-search.json"}
    rep = json.loads(path.read_text())
    runs = [{"task": r.get("task"), "mode": r.get("mode"), "seed": r.get("seed"), "measurements": r.get("measurements"),
             "finished": r.get("finished"), "budget_reached": r.get("finished") == "budget spent",
             "best_speedup": r.get("final_best")} for r in rep.get("runs", [])]
    measured = int(after.get("measured") or 0) - int(before.get("measured") or 0)
    ok = int(after.get("ok") or 0) - int(before.get("ok") or 0)
    wall = float(rep.get("worker_wall_s") or 0.0)
    phases = {k: round(float(v) - float((before.get("phases_s") or {}).get(k, 0.0)), 3)
              for k, v in (after.get("phases_s") or {}).items()}
    return {"runs": runs, "rounds": rep.get("rounds"), "stopped": rep.get("stopped"),
            "kernels_measured": rep.get("kernels_measured"), "service_rounds": rep.get("service_runs"),
            "measuring_wall_s": round(wall, 1), "service_kernels": measured, "service_ok": ok,
            "kernels_per_hour_of_measuring": round(measured * 3600 / wall, 1) if wall > 0 else None,
            "correct_per_hour_of_measuring": round(ok * 3600 / wall, 1) if wall > 0 else None,
            "phases_s": phases, "comparison": rep.get("comparison")}


if __name__ == "__main__":
    sys.exit(main())
