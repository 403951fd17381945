"""Run a built library set's modules on their tasks' correctness cases.

Each module goes through pipelines.profiling.check: a sandboxed child, every correctness case of
its task, judged by the task's check. On the CPU (the Triton interpreter) published launchers
that ask the device at import or launch (driver properties, CUDA streams, autotuning) fail by
design, and the outcome says so; `device="cuda"` runs the same check on a GPU host.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

MANIFEST_FILE = "library-manifest.json"  # as build.py writes it (build needs pyarrow, this does not)


def check_set(folder: str | Path, ids: list[str] | None = None, timeout_s: float = 180.0,
              workers: int = 1, device: str = "cpu", say: Callable[[str], None] = print) -> dict[str, dict]:
    """entry id -> {task, ok, failure_kind, message, seconds} for the built entries (or `ids`).

    Raises:
        ValueError: the folder holds no library-manifest.json, or `ids` names an entry it lacks.
    """
    from pipelines.profiling.check import check_sources

    root = Path(folder)
    try:
        built = json.loads((root / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{root}: no readable {MANIFEST_FILE} ({exc}); build the set first") from None
    chosen = ids or sorted(built, key=lambda i: (built[i]["task"], i))
    unknown = [i for i in chosen if i not in built]
    if unknown:
        raise ValueError(f"not in {root / MANIFEST_FILE}: {', '.join(unknown)}")
    items = [(built[i]["task"], (root / built[i]["file"]).read_text(encoding="utf-8")) for i in chosen]
    outcomes = check_sources(items, n_workers=workers, timeout_s=timeout_s, device=device)
    results: dict[str, dict] = {}
    for entry_id, outcome in zip(chosen, outcomes, strict=True):
        results[entry_id] = {"task": built[entry_id]["task"], "ok": outcome.ok, "failure_kind": outcome.failure_kind,
                             "message": outcome.message, "seconds": round(outcome.seconds, 2)}
        verdict = "ok" if outcome.ok else f"{outcome.failure_kind}: {outcome.message}"
        say(f"{built[entry_id]['task']:<17} {entry_id:<34} {verdict[:160]}")
    passed = sum(r["ok"] for r in results.values())
    say(f"{device} check: {passed} of {len(results)} correct on every correctness case")
    return results
