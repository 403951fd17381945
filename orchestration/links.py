"""Where the UIs of `kernelcast ui` are served, and links into them: what ui.json says, the
ports named in the environment, run links moved onto the live ports. Standard library only, so
assets, resources and the report reach it without the UI's server code (orchestration.ui).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

UI_STATE = "ui.json"
DAGSTER_PORT_ENV = "KERNELCAST_DAGSTER_PORT"
DEFAULT_DAGSTER_PORT = 3000


def _port(value: object) -> int | None:
    text = str(value or "")
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def served_ports(home: Path) -> dict[str, int] | None:
    """{"dagster": port, "mlflow": port} of the `kernelcast ui` serving this home, or None (none
    serving: no ui.json, an unreadable one, or one left by a process that is gone)."""
    try:
        state = json.loads((Path(home) / UI_STATE).read_text())
    except (OSError, ValueError):
        return None
    ports = {k: _port(state.get(f"{k}_port")) for k in ("dagster", "mlflow")} if isinstance(state, dict) else {}
    if not ports or None in ports.values() or not _alive(state.get("pid")):
        return None
    return ports  # type: ignore[return-value]


def live_ports(home: Path | None = None) -> dict[str, int]:
    """The ports links should name: those of this process's `kernelcast ui` ($KERNELCAST_*_PORT,
    set for its children), else those of the ui serving `home` (ui.json), else 3000 and 5000."""
    from models.registry.tracking import DEFAULT_MLFLOW_PORT, MLFLOW_PORT_ENV

    env = {"dagster": _port(os.environ.get(DAGSTER_PORT_ENV)), "mlflow": _port(os.environ.get(MLFLOW_PORT_ENV))}
    served = (served_ports(home) if home is not None else None) or {}
    return {"dagster": env["dagster"] or served.get("dagster") or DEFAULT_DAGSTER_PORT,
            "mlflow": env["mlflow"] or served.get("mlflow") or DEFAULT_MLFLOW_PORT}


def dagster_run_url(run_id: str, port: int | None = None) -> str:
    """A link to a run in the Dagster UI.

    >>> dagster_run_url("0b1c", port=3001)
    'http://127.0.0.1:3001/runs/0b1c'
    """
    return f"http://127.0.0.1:{port or DEFAULT_DAGSTER_PORT}/runs/{run_id}"


def relink(url: str | None, port: int) -> str | None:
    """A stored 127.0.0.1 link moved onto `port` (a report written while the UI served elsewhere).

    >>> relink("http://127.0.0.1:5000/#/experiments/1/runs/ab", 5123)
    'http://127.0.0.1:5123/#/experiments/1/runs/ab'
    """
    if not url or not url.startswith("http://127.0.0.1:"):
        return url
    rest = url.removeprefix("http://127.0.0.1:")
    path = rest[len(rest.split("/", 1)[0]):]
    return f"http://127.0.0.1:{port}{path}"
