"""What a worker run reports: `Progress` while it runs, `RunSummary` (rows, counts by task and
failure kind, median speedups, the measuring child's seconds by phase) when it ends.

Kept apart from the loop so that callers (the command line, the orchestration, benchmarks) read a
run's outcome without the loop's machinery. Standard library only.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from warehouse.formats import FAILURE_KINDS


@dataclass
class Progress:
    """What the progress callback sees."""

    done: int  # rows in the output, this run and earlier attempts
    total: int  # kernels in the batch
    ok: int
    failed: int
    rate_per_s: float  # kernels finished per second in this run
    eta_s: float | None
    compiling: int
    waiting: int  # compiled, waiting for the timer

    def line(self) -> str:
        eta = "?" if self.eta_s is None else _fmt_s(self.eta_s)
        return (
            f"[profile] {self.done}/{self.total} done (ok {self.ok}, failed {self.failed}), "
            f"{self.rate_per_s:.2f} kernels/s, ETA {eta}, compiling {self.compiling}, waiting {self.waiting}"
        )


@dataclass
class RunSummary:
    out_path: Path
    batch_id: str
    total: int
    measured_now: int
    rows: list[dict] = field(repr=False, default_factory=list)
    stopped: str = "complete"  # "complete" | "time budget" | "limit" | "interrupted"
    elapsed_s: float = 0.0
    hardware_id: str | None = None
    shipped: dict[str, int] = field(default_factory=dict)  # checked outputs by how they came: ipc | file
    phases_s: dict[str, float] = field(default_factory=dict)  # the measuring child's (and verifier_*: the verifier's) seconds by phase, summed
    ref_cache: dict[str, object] = field(default_factory=dict)  # the reference cache's file and use

    def by_task(self) -> dict[str, dict]:
        """{task: {"ok": n, "failed": {kind: n}, "median_speedup": x}} over all rows."""
        out: dict[str, dict] = {}
        for r in self.rows:
            t = out.setdefault(r["task"], {"ok": 0, "failed": Counter(), "speedups": []})
            if r["status"] == "ok":
                t["ok"] += 1
                t["speedups"].append(r["speedup"])
            else:
                t["failed"][r["failure_kind"]] += 1
        for t in out.values():
            sp = t.pop("speedups")
            t["median_speedup"] = statistics.median(sp) if sp else None
            t["failed"] = dict(t["failed"])
        return out

    def table(self) -> str:
        """A short text table by task: ok, failures by kind, median speedup."""
        kinds = list(FAILURE_KINDS)
        head = ["task", "ok"] + kinds + ["median_speedup"]
        lines = [head]
        for task, t in sorted(self.by_task().items()):
            ms = t["median_speedup"]
            lines.append([task, str(t["ok"])] + [str(t["failed"].get(k, 0)) for k in kinds] + ["-" if ms is None else f"{ms:.3f}"])
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        text = "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in lines)
        return (
            f"{text}\n{len(self.rows)}/{self.total} kernels in {self.out_path} ({self.stopped}; "
            f"{self.measured_now} this run in {_fmt_s(self.elapsed_s)}; hardware {self.hardware_id})"
        )


def _fmt_s(s: float) -> str:
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
