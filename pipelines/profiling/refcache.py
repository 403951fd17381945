"""Reference timings kept across worker runs, per (hardware, harness version, protocol, task, case).

A worker run used to time every task's reference when it first met the task (3 timings a case,
about a second a task on a GPU), so short runs - the live search's rounds - spent much of their
time there. The parent keeps the reference timings it accepted (audit.ReferenceBook) in a small
JSON file (`default_path`: --ref-cache, $KERNELCAST_REF_CACHE, ~/.cache/kernelcast/); the next run on the same hardware, harness version and protocol starts its book from
it and tells the measuring child which cases are still fresh (newer than --ref-refresh-s), so
only stale or missing cases are timed again. Drift is still followed: a case whose newest timing
is older than the refresh interval is timed again, as within one run.

Entries of another harness version are never used (a harness change can change what a
measurement means) and are dropped when the file is next written; entries older than
`MAX_AGE_S` are dropped too. A missing, unreadable or malformed file is an empty cache (one
warning line), never a failed run. Writes are atomic (a temporary file renamed over the old one).

Imports only the standard library.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "KERNELCAST_REF_CACHE"
# 2: the reference is timed through the kernel's own feed (runner.Measurer.timed_case_steps); format-1
# timings were taken on an input left in place, so they are not reused.
FORMAT = 2
KEEP = 5  # timings kept per key (audit.REF_KEEP: the book uses the middle of these)
MAX_AGE_S = 24 * 3600.0
TIMING_KEYS = ("median_ms", "mean_ms", "stderr_ms", "reps")


def default_path(given: str | None = None) -> Path | None:
    """The cache file: `given` (the worker's --ref-cache), else $KERNELCAST_REF_CACHE, else
    ~/.cache/kernelcast/reference-timings.json (one per host and user, as the sandbox memo);
    "off" at either level: no cache."""
    chosen = given or os.environ.get(ENV) or str(Path.home() / ".cache" / "kernelcast" / "reference-timings.json")
    return None if chosen == "off" else Path(chosen)


def _valid(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    try:
        ok = all(isinstance(entry[k], str) for k in ("hardware_id", "harness_version", "protocol", "task", "case_id"))
        values = [float(entry[k]) for k in ("median_ms", "mean_ms", "stderr_ms", "taken_at")] + [int(entry["reps"])]
    except (KeyError, TypeError, ValueError):
        return False
    host = entry.get("host_ms")
    if host is not None and not (isinstance(host, (int, float)) and math.isfinite(host) and host >= 0):
        return False
    return ok and all(math.isfinite(v) for v in values) and values[0] > 0 and values[1] > 0 and values[-1] >= 1


class RefCache:
    """The file cache of one worker run (None path: nothing kept)."""

    def __init__(self, path: str | Path | None, max_age_s: float = MAX_AGE_S):
        self.path = Path(path) if path else None
        self.max_age_s = max_age_s
        self.scope: tuple[str, str, str] | None = None  # (hardware id, harness version, protocol)
        self.entries: list[dict] = []  # every valid, recent entry of the file (all scopes)
        self.hits = 0  # cases a job did not time because the cache had them fresh
        self.timed = 0  # reference timings taken in this run

    def _read(self) -> list[dict]:
        if self.path is None or not self.path.exists():
            return []
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("format"), int) and doc["format"] != FORMAT:
                raise ValueError(f"format {doc['format']}, this harness writes {FORMAT}: timed again")
            entries = doc["entries"] if isinstance(doc, dict) and doc.get("format") == FORMAT else None
            if not isinstance(entries, list):
                raise ValueError("not a reference-timing cache")
        except (OSError, ValueError, KeyError) as e:
            log.warning("reference timing cache %s ignored: %s", self.path, e)
            return []
        now = time.time()
        return [e for e in entries if _valid(e) and now - float(e["taken_at"]) <= self.max_age_s]

    def bind(self, hardware_id: str, harness_version: str, protocol: str) -> dict[str, list[dict]]:
        """Read the file for this run's scope; {task: [timings with case_id]} to start the book from."""
        self.scope = (hardware_id, harness_version, protocol)
        self.entries = self._read()
        out: dict[str, list[dict]] = {}
        for e in sorted(self._mine(), key=lambda e: float(e["taken_at"])):
            out.setdefault(e["task"], []).append({"case_id": e["case_id"], **{k: e[k] for k in TIMING_KEYS},
                                                  **({"host_ms": e["host_ms"]} if e.get("host_ms") is not None else {})})
        return out

    def _mine(self) -> list[dict]:
        if self.scope is None:
            return []
        hw, version, protocol = self.scope
        return [e for e in self.entries
                if (e["hardware_id"], e["harness_version"], e["protocol"]) == (hw, version, protocol)]

    def freshness(self, task: str, refresh_s: float, now: float | None = None) -> dict[str, str]:
        """case id -> "fresh" (newest timing younger than refresh_s) or "stale", for the cases of
        `task` this run's scope has timings of (the measuring child times unlisted cases itself)."""
        now = time.time() if now is None else now
        newest: dict[str, float] = {}
        for e in self._mine():
            if e["task"] == task:
                newest[e["case_id"]] = max(newest.get(e["case_id"], 0.0), float(e["taken_at"]))
        return {cid: "fresh" if now - t <= refresh_s else "stale" for cid, t in newest.items()}

    def record(self, task: str, timings: list[dict], now: float | None = None) -> None:
        """Add the reference timings the parent accepted (each with its case id) and write the file."""
        if self.scope is None or not timings:
            return
        now = time.time() if now is None else now
        hw, version, protocol = self.scope
        for t in timings:
            entry = {"hardware_id": hw, "harness_version": version, "protocol": protocol, "task": task,
                     "case_id": str(t["case_id"]), "taken_at": now, **{k: t[k] for k in TIMING_KEYS}}
            if t.get("host_ms") is not None:
                entry["host_ms"] = t["host_ms"]
            if _valid(entry):
                self.entries.append(entry)
                self.timed += 1
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        version = self.scope[1]
        kept: dict[tuple, list[dict]] = {}
        for e in sorted(self.entries, key=lambda e: float(e["taken_at"])):
            if e["harness_version"] != version:
                continue  # another harness's timings mean something else: dropped
            key = (e["hardware_id"], e["protocol"], e["task"], e["case_id"])
            kept[key] = (kept.get(key, []) + [e])[-KEEP:]
        self.entries = [e for group in kept.values() for e in group]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".refcache-", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "entries": self.entries}, f)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("reference timing cache %s not written: %s", self.path, e)
