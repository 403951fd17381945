"""`kernelcast ui`: the Dagster UI and the MLflow UI side by side on 127.0.0.1.

Dagster is served by `dg dev` (dagster-dg-cli) from the project's `[tool.dg]` settings in
pyproject.toml: the code location `orchestration.definitions`, under the same name as
workspace.yaml gives it, on the instance under $KERNELCAST_HOME/dagster that `kernelcast run`
writes to. Both servers' own output (the daemon's INFO lines, MLflow's access log, deprecation
warnings) goes to $KERNELCAST_HOME/logs/ui-<time>.log; the terminal gets the two URLs and
where that log is.

Both servers run as child process groups; Ctrl-C or SIGTERM stops both (SIGTERM to each group,
then SIGKILL after a grace period), so nothing is left listening.

The MLflow link printed opens the project's training experiment (its id in the link, the
classic-ML view): MLflow's own home page is a GenAI welcome page and it has no setting for
another one. The store is prepared first (the project's experiments, artifact locations of this
home, no empty Default). The MLflow port reaches every child as $KERNELCAST_MLFLOW_PORT (and
Dagster's as $KERNELCAST_DAGSTER_PORT), so run links made by the Dagster code location point at
these servers. $KERNELCAST_HOME/ui.json names the ports and, while both serve, the serving
process: a `kernelcast run` or `kernelcast report` started from another terminal builds its
links from it (`live_ports`), and after the UIs stop it still names the ports the home was
served on (the default ports of the next `kernelcast ui`). While both serve,
reports/ui-ports.js names the ports for the HTML report's pages.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestration.runner import prepare_home
from orchestration.settings import Settings

GRACE_S = 10.0
REPO = Path(__file__).resolve().parent.parent
from orchestration.links import (  # noqa: E402,F401  (the ports' helpers, below the servers)
    DAGSTER_PORT_ENV,
    DEFAULT_DAGSTER_PORT,
    PORTS_SCRIPT,
    UI_STATE,
    dagster_run_url,
    home_ports,
    live_ports,
    ports_script,
    record_ports,
    relink,
    served_ports,
)


def default_ports(home: Path) -> dict[str, int]:
    """The ports `kernelcast ui` serves on when none is given: the ones the home was last served
    on (links made since name them), else 3000 and 5000."""
    from models.registry.tracking import DEFAULT_MLFLOW_PORT

    return home_ports(home) or {"dagster": DEFAULT_DAGSTER_PORT, "mlflow": DEFAULT_MLFLOW_PORT}


def _commands(settings: Settings, dagster_port: int, mlflow_port: int) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent
    dg_cli = bin_dir / "dg"
    # dg dev from the repository root reads [tool.dg]; without dagster-dg-cli, the workspace file.
    dagster = ([str(dg_cli), "dev"] if dg_cli.exists()
               else [str(bin_dir / "dagster"), "dev", "-w", str(REPO / "workspace.yaml")])
    return {
        "dagster": [*dagster, "-h", "127.0.0.1", "-p", str(dagster_port), "--log-level", "warning"],
        "mlflow": [
            str(bin_dir / "mlflow"), "server", "--backend-store-uri", settings.mlflow_uri,
            "--default-artifact-root", settings.mlflow_artifacts.resolve().as_uri(),
            "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
        ],
    }


def stop(procs: dict[str, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + GRACE_S
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def serve(settings: Settings, dagster_port: int | None = None, mlflow_port: int | None = None) -> None:
    """Serve both UIs until Ctrl-C or SIGTERM (ports None: `default_ports`)."""
    from models.registry.tracking import MLFLOW_PORT_ENV, experiment_url, prepare_store

    prepare_home(settings)
    import mlflow  # noqa: F401 - configures its loggers on import; quieted right after

    for name in ("mlflow", "alembic"):  # the store's first-use INFO lines belong in no terminal
        logging.getLogger(name).setLevel(logging.WARNING)
    defaults = default_ports(settings.home)
    ports = {"dagster": dagster_port or defaults["dagster"], "mlflow": mlflow_port or defaults["mlflow"]}
    training_experiment = prepare_store(settings.mlflow_uri)[0]
    os.environ[MLFLOW_PORT_ENV] = str(ports["mlflow"])  # run links of this process and its children
    os.environ[DAGSTER_PORT_ENV] = str(ports["dagster"])
    script = settings.reports_dir / PORTS_SCRIPT
    log_path = settings.home / "logs" / f"ui-{time.strftime('%Y%m%d-%H%M%S')}.log"
    # The servers' Python warnings go to the log like the rest of their output.
    # MLFLOW_TRACKING_URI: the store whose home the MLflow server resolves `kernelcast-home:`
    # artifact locations against (models.registry.home_artifacts).
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MLFLOW_TRACKING_URI": settings.mlflow_uri}
    procs: dict[str, subprocess.Popen] = {}
    stopping = False

    def _on_signal(signum, frame):  # noqa: ARG001
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with open(log_path, "a", buffering=1) as log:
        try:
            for name, cmd in _commands(settings, ports["dagster"], ports["mlflow"]).items():
                # start_new_session: the server and its own children form one group we can stop.
                procs[name] = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True,
                                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            record_ports(settings.home, ports, os.getpid(), str(log_path))
            script.write_text(ports_script(ports))
            print(f"Dagster UI: http://127.0.0.1:{ports['dagster']}\n"
                  f"MLflow UI:  {experiment_url(training_experiment, ports['mlflow'])}\n"
                  f"log: {log_path}   (Ctrl-C stops both)", flush=True)
            while not stopping:
                dead = [n for n, p in procs.items() if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"{dead[0]} server exited with code {procs[dead[0]].returncode} "
                                       f"(see {log_path})")
                time.sleep(0.5)
        finally:
            script.unlink(missing_ok=True)
            if procs:  # the ports stay the home's: links made from now on name them
                record_ports(settings.home, ports, None, str(log_path))
            stop(procs)
            print("stopped Dagster and MLflow UIs", flush=True)
