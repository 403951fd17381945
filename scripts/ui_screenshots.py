"""The first screens a user sees after a run, as PNGs: the HTML report, MLflow where `kernelcast ui`
opens it (the training experiment), the @champion version's page, and the Dagster run that made
the report.

    PYTHONPATH=$PWD .venv/bin/python scripts/ui_screenshots.py --home $KERNELCAST_HOME --out docs/images

Starts `kernelcast ui` for the home on two free ports (the home's recorded ports are put back
after), drives Debian's /usr/bin/chromium headless through playwright (1400 x 900 windows, a new
profile, no first-run pages), then stops the UIs. The PNGs are stored as 256-colour palettes.
Needs a home with a finished `kernelcast run` (a dataset version, its report, promotion).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestration.links import answers, free_port

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
WINDOW = {"width": 1400, "height": 900}


def _save(page, path: Path) -> None:
    from PIL import Image

    page.screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(256).save(path, optimize=True)
    print(f"{path} ({path.stat().st_size // 1024} KiB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, required=True, help="a KERNELCAST_HOME with a finished run")
    ap.add_argument("--out", type=Path, required=True, help="folder of the PNGs")
    ap.add_argument("--timeout-s", type=float, default=600, help="how long the UIs may take to start")
    args = ap.parse_args()
    home = args.home.resolve()
    table_path = next(iter(sorted((home / "reports").glob("ds-*/forecasters.table.json"),
                                  key=lambda p: p.stat().st_mtime, reverse=True)), None)
    if table_path is None:
        print(f"{home}: no evaluation report; run `kernelcast run` first", file=sys.stderr)
        return 2
    table = json.loads(table_path.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    from models.registry import SURROGATE_MODEL as NAME
    from models.registry.tracking import model_url

    state = home / "ui.json"
    kept = state.read_text() if state.is_file() else None
    dport, mport = free_port(), free_port()
    env = {**os.environ, "KERNELCAST_HOME": str(home), "PYTHONPATH": str(REPO)}
    ui = subprocess.Popen([sys.executable, "-m", "orchestration.cli", "ui", "--dagster-port", str(dport),
                           "--mlflow-port", str(mport)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        printed = [ui.stdout.readline().strip() for _ in range(3)]
        mlflow_link = next((line.split(None, 2)[2] for line in printed if line.startswith("MLflow UI:")), None)
        if mlflow_link is None:
            print(f"kernelcast ui did not start: {printed}", file=sys.stderr)
            return 1
        deadline = time.monotonic() + args.timeout_s
        while not (answers(f"http://127.0.0.1:{mport}/health") and answers(f"http://127.0.0.1:{dport}/server_info")):
            if ui.poll() is not None or time.monotonic() > deadline:
                print(f"kernelcast ui did not start: {printed}", file=sys.stderr)
                return 1
            time.sleep(1)
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
        champion = client.get_model_version_by_alias(NAME, "champion").version
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            context = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                            args=FLAGS, viewport=WINDOW)
            page = context.new_page()
            page.goto((home / table["report"]).as_uri() if not Path(table["report"]).is_absolute()
                      else Path(table["report"]).as_uri())
            page.wait_for_timeout(1000)
            _save(page, args.out / "report.png")
            page.goto(mlflow_link)
            page.wait_for_function("() => document.body.innerText.includes('cost_model')", timeout=60_000)
            try:  # MLflow's assistant panel opens once on a first visit; closed as a user would
                page.locator('[data-component-id="mlflow.assistant.chat_panel.close"], '
                             'button[aria-label="Close"]').first.click(timeout=5000)
            except Exception:  # noqa: BLE001 - no panel this time
                pass
            page.wait_for_timeout(1500)
            _save(page, args.out / "mlflow-experiment.png")
            page.goto(model_url(NAME, mport).replace(f"/models/{NAME}", f"/models/{NAME}/versions/{champion}"))
            page.wait_for_function("() => document.body.innerText.includes('champion')", timeout=60_000)
            page.wait_for_timeout(1500)
            _save(page, args.out / "mlflow-champion.png")
            page.goto(f"http://127.0.0.1:{dport}/runs/{table['evaluation_dagster_run_id']}")
            page.wait_for_function("() => document.body.innerText.includes('calibration_report')", timeout=120_000)
            page.wait_for_timeout(3000)
            _save(page, args.out / "dagster-run.png")
            context.close()
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.communicate(timeout=60)
        if kept is not None:  # the home keeps the ports it is served on, not these
            state.write_text(kept)
        else:
            state.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
