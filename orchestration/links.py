"""Where the UIs of `kernelcast ui` are served, and links into them: what ui.json says, the
ports named in the environment, run links moved onto the live ports. Standard library only, so
assets, resources and the report reach it without the UI's server code (orchestration.ui).

A home keeps the ports it was last served on (ui.json stays after the UI stops, its process
gone): links made while no UI serves name those ports, and `kernelcast ui` without port options
serves there again, so links stored where they cannot be rewritten (Dagster's metadata) keep
working. The HTML report reads the ports at the time it is read: while the UI serves,
reports/ui-ports.js names them and the pages move their links onto them.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from pathlib import Path

UI_STATE = "ui.json"
PORTS_SCRIPT = "ui-ports.js"  # in the reports folder, while a `kernelcast ui` serves the home
PORTS_GLOBAL = "KERNELCAST_UI_PORTS"  # what the script sets, {"dagster": N, "mlflow": M}
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


def _state(home: Path) -> tuple[dict[str, int] | None, object]:
    """(the ports ui.json names, its pid); (None, None) when it is missing or unreadable."""
    try:
        state = json.loads((Path(home) / UI_STATE).read_text())
    except (OSError, ValueError):
        return None, None
    ports = {k: _port(state.get(f"{k}_port")) for k in ("dagster", "mlflow")} if isinstance(state, dict) else {}
    if not ports or None in ports.values():
        return None, None
    return ports, state.get("pid")  # type: ignore[return-value]


def served_ports(home: Path) -> dict[str, int] | None:
    """{"dagster": port, "mlflow": port} of the `kernelcast ui` serving this home, or None (none
    serving: no ui.json, an unreadable one, or one left by a process that is gone)."""
    ports, pid = _state(home)
    return ports if ports is not None and _alive(pid) else None


def home_ports(home: Path) -> dict[str, int] | None:
    """The ports this home's UIs were last served on (ui.json, kept after they stop), or None
    when it was never served."""
    return _state(home)[0]


def record_ports(home: Path, ports: dict[str, int], pid: int | None, log: str | None = None) -> None:
    """ui.json: the ports the home is served on, and the serving process (None once it stopped)."""
    (Path(home) / UI_STATE).write_text(json.dumps({"pid": pid, "dagster_port": ports["dagster"],
                                                  "mlflow_port": ports["mlflow"], "log": log}))


def live_ports(home: Path | None = None) -> dict[str, int]:
    """The ports links should name: those of this process's `kernelcast ui` ($KERNELCAST_*_PORT,
    set for its children), else those of the ui serving `home`, else the ports `home` was last
    served on (both from ui.json), else 3000 and 5000."""
    from models.registry.tracking import DEFAULT_MLFLOW_PORT, MLFLOW_PORT_ENV

    env = {"dagster": _port(os.environ.get(DAGSTER_PORT_ENV)), "mlflow": _port(os.environ.get(MLFLOW_PORT_ENV))}
    known = (home_ports(home) if home is not None else None) or {}
    return {"dagster": env["dagster"] or known.get("dagster") or DEFAULT_DAGSTER_PORT,
            "mlflow": env["mlflow"] or known.get("mlflow") or DEFAULT_MLFLOW_PORT}


def ports_script(ports: dict[str, int]) -> str:
    """reports/ui-ports.js: the served ports, as the report pages read them.

    >>> ports_script({"dagster": 3001, "mlflow": 5001})
    'window.KERNELCAST_UI_PORTS = {"dagster": 3001, "mlflow": 5001};\\n'
    """
    return f"window.{PORTS_GLOBAL} = {json.dumps({k: int(ports[k]) for k in ('dagster', 'mlflow')})};\n"


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


def free_port() -> int:
    """A TCP port of this host free now (the OS picks it), for a UI or server started next."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether `url` answers 200 now (a UI or server that has finished starting)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - refused, reset, timed out, an HTTP error: not up yet
        return False
