"""The kernelcast-versus-gpumode benchmark: which kernels, and what the two protocols' rows say.

`python3 -m benchmarks.harness_bench` runs it on a GPU host; this module holds what it computes, so the
CPU tests check the same code:

* `draw_kernels`: a deterministic draw of committed kernels (data/measurements/<hw>/kernels-*.parquet,
  sources included) that an earlier run measured correct, a quota per task;
* `submission_rows`: published GPU MODE submissions from a folder, as batch rows of task trimul;
* `compare`: per kernel correct under both protocols, the ratio kernelcast/gpumode of the kernel's
  time (geometric mean over cases of kernelcast's median over gpumode's mean) and of the speedup,
  summarised by median, 5th and 95th percentile, overall and per task;
* `submissions_table`: each submission's outcome under each protocol, with GPU MODE's score (the
  geometric mean over benchmark cases of the mean time, microseconds);
* `identical_code_rows`: per task a kernel that is the reference itself (GPU MODE's way: it
  imports `reference.ref_kernel` and returns its result), whose speedup must read 1.00 under
  every protocol.

Imports only the standard library, numpy and pyarrow (the GPU host has no polars).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from warehouse.formats import BATCH_SCHEMA

SUBMISSION_PREFIX = "gpumode-submission:"
DEFAULT_QUOTAS = {"trimul": 2}  # a trimul kernel takes ~17 s under gpumode (100 calls of each case); the rest share the draw
SALT = "kernelcast-harness-bench"


def _rank(kernel_id: str, seed: int) -> str:
    return hashlib.sha256(f"{SALT}:{seed}:{kernel_id}".encode()).hexdigest()


def measured_ok(results: Iterable[Path]) -> set[str]:
    """Kernel ids with a correct kernelcast measurement in any of the result files."""
    ok: set[str] = set()
    for path in results:
        t = pq.read_table(path, columns=["kernel_id", "status", "protocol"])
        for kid, status, protocol in zip(*(t.column(c).to_pylist() for c in ("kernel_id", "status", "protocol"))):
            if status == "ok" and protocol == "kernelcast":
                ok.add(kid)
    return ok


def draw_kernels(data_dir: str | Path, n: int, *, tasks: Iterable[str] | None = None,
                 quotas: dict[str, int] | None = None, seed: int = 0) -> list[dict]:
    """`n` committed kernels (kernel_id, task, source), measured correct before, spread over tasks.

    Tasks with a quota get exactly that many (if they have them); the others split the rest as
    evenly as they can, the first tasks in name order taking one more when it does not divide.
    Within a task, kernels are taken in the order of a hash of their id: the same data, n and
    seed always give the same kernels.

    Args:
        data_dir: a folder of kernels-*.parquet and results-*.parquet.
        n: how many kernels.
        tasks: only these tasks (default: every task with eligible kernels).
        quotas: task -> count (default DEFAULT_QUOTAS).
        seed: another seed, another draw.
    """
    data_dir = Path(data_dir)
    ok = measured_ok(sorted(data_dir.glob("results-*.parquet")))
    by_task: dict[str, dict[str, dict]] = {}
    for path in sorted(data_dir.glob("kernels-*.parquet")):
        t = pq.read_table(path, columns=["kernel_id", "task", "source"])
        for row in t.to_pylist():
            if row["kernel_id"] in ok and (tasks is None or row["task"] in set(tasks)):
                by_task.setdefault(row["task"], {}).setdefault(row["kernel_id"], row)
    if not by_task:
        raise ValueError(f"no committed kernel with a correct measurement in {data_dir}")
    quotas = {t: q for t, q in (DEFAULT_QUOTAS if quotas is None else quotas).items() if t in by_task}
    rest = sorted(t for t in by_task if t not in quotas)
    left = max(0, n - sum(quotas.values()))
    share = {t: left // len(rest) + (1 if i < left % len(rest) else 0) for i, t in enumerate(rest)} if rest else {}
    chosen: list[dict] = []
    for task in sorted(by_task):
        want = quotas.get(task, share.get(task, 0))
        ranked = sorted(by_task[task].values(), key=lambda r: _rank(r["kernel_id"], seed))
        chosen += ranked[:want]
    return chosen[:n]


def submission_rows(folder: str | Path, task: str = "trimul") -> list[dict]:
    """Every *.py in `folder` as a batch row (kernel id SUBMISSION_PREFIX + file stem), unmodified."""
    rows = []
    for path in sorted(Path(folder).glob("*.py")):
        rows.append({"kernel_id": SUBMISSION_PREFIX + path.stem, "task": task, "source": path.read_text(encoding="utf-8")})
    return rows


def interleave(rows: list[dict]) -> list[dict]:
    """Rows round-robin over tasks (first of each task, then second, ...): a run stopped by its
    time budget loses kernels of every task alike, not a whole task.

    >>> [r["task"] for r in interleave([{"task": "a"}, {"task": "a"}, {"task": "b"}])]
    ['a', 'b', 'a']
    """
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    out, i = [], 0
    while len(out) < len(rows):
        out += [group[i] for group in by_task.values() if i < len(group)]
        i += 1
    return out


def write_batch(rows: list[dict], path: str | Path) -> Path:
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in BATCH_SCHEMA.names} for r in rows], schema=BATCH_SCHEMA), path)
    return Path(path)


def split_rows(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(committed kernels' rows, submissions' rows) of a result table."""
    ids = table.column("kernel_id").to_pylist()
    mask = pa.array([not k.startswith(SUBMISSION_PREFIX) for k in ids], type=pa.bool_())
    return table.filter(mask), table.filter(pc.invert(mask))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "median": None, "p5": None, "p95": None}
    a = np.asarray(values, dtype=np.float64)
    return {"n": int(a.size), "median": float(np.median(a)), "p5": float(np.percentile(a, 5)),
            "p95": float(np.percentile(a, 95))}


def compare(kernelcast_rows: list[dict], gpumode_rows: list[dict]) -> dict:
    """Ratios kernelcast / gpumode for the kernels correct under both, and the outcome counts.

    Returns:
        {"time_ratio": spread, "speedup_ratio": spread, "per_task": {task: {...}}, "both_ok": n,
         "status": {protocol: {outcome: n}}, "disagree": [kernel ids ok under one protocol only]}
    """
    kc = {r["kernel_id"]: r for r in kernelcast_rows}
    gm = {r["kernel_id"]: r for r in gpumode_rows}
    time_ratio: dict[str, list[float]] = {}
    speedup_ratio: dict[str, list[float]] = {}
    disagree = []
    for kid in sorted(set(kc) & set(gm)):
        a, b = kc[kid], gm[kid]
        if (a["status"] == "ok") != (b["status"] == "ok"):
            disagree.append(kid)
        if a["status"] != "ok" or b["status"] != "ok" or a["case_ids"] != b["case_ids"]:
            continue
        ratios = [x / y for x, y in zip(a["kernel_median_ms"], b["kernel_mean_ms"])]
        time_ratio.setdefault(a["task"], []).append(_geomean(ratios))
        speedup_ratio.setdefault(a["task"], []).append(a["speedup"] / b["speedup"])
    status: dict[str, dict[str, int]] = {}
    for name, rows in (("kernelcast", kernelcast_rows), ("gpumode", gpumode_rows)):
        for r in rows:
            key = "ok" if r["status"] == "ok" else r["failure_kind"]
            status.setdefault(name, {})[key] = status.setdefault(name, {}).get(key, 0) + 1
    every = [x for v in time_ratio.values() for x in v]
    every_sp = [x for v in speedup_ratio.values() for x in v]
    return {
        "both_ok": len(every), "time_ratio": _spread(every), "speedup_ratio": _spread(every_sp),
        "per_task": {t: {"time_ratio": _spread(time_ratio[t]), "speedup_ratio": _spread(speedup_ratio[t])}
                     for t in sorted(time_ratio)},
        "status": status, "disagree": disagree,
    }


def submissions_table(kernelcast_rows: list[dict], gpumode_rows: list[dict]) -> list[dict]:
    """Each submission under each protocol: outcome, speedup, GPU MODE's score in microseconds."""
    out = []
    kc = {r["kernel_id"]: r for r in kernelcast_rows}
    gm = {r["kernel_id"]: r for r in gpumode_rows}
    for kid in sorted(set(kc) | set(gm)):
        entry: dict = {"submission": kid.removeprefix(SUBMISSION_PREFIX)}
        for name, rows in (("kernelcast", kc), ("gpumode", gm)):
            r = rows.get(kid)
            if r is None:
                entry[name] = {"status": "missing"}
                continue
            item = {"status": r["status"] if r["status"] == "ok" else r["failure_kind"], "error": r["error"]}
            if r["status"] == "ok":
                item["speedup"] = r["speedup"]
                item["score_us"] = _geomean([m * 1e3 for m in r["kernel_mean_ms"]])  # GPU MODE ranks by this
                item["median_score_us"] = _geomean([m * 1e3 for m in r["kernel_median_ms"]])
                item["case_mean_us"] = [m * 1e3 for m in r["kernel_mean_ms"]]
            entry[name] = item
        out.append(entry)
    return out


IDENTICAL_PREFIX = "identical-code:"
IDENTICAL_SOURCE = "from reference import ref_kernel\n\n\ndef custom_kernel(data):\n    return ref_kernel(data)\n"


def identical_code_rows(tasks: Iterable[str]) -> list[dict]:
    """Batch rows (kernel_id, task, source) of the reference itself, one per task."""
    return [{"kernel_id": f"{IDENTICAL_PREFIX}{t}", "task": t, "source": IDENTICAL_SOURCE} for t in tasks]
