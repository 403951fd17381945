"""`kernelcast run` in a real terminal: what reaches the screen is the display's own lines.

Captured output cannot show the bug this guards against: rich's live display hands
sys.stdout / sys.stderr back to the terminal only when its console is a terminal, so these tests
run the code in a pseudo-terminal (the stdlib `pty`) and read what a user would see. The whole
smoke run in a terminal is the first step of tests/orchestration/test_backfill_e2e.py.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
# What library output looks like: Dagster's console log ("... - dagster - DEBUG - ..."), logging's
# default "LEVEL:name:" and MLflow's "2026/12/01 10:00:00 INFO mlflow...", Python warnings.
LIBRARY_LINE = re.compile(r"\b(DEBUG|INFO|WARNING)\b|dagster - |STEP_OUTPUT|\w+Warning:")


def run_in_terminal(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """Run argv with a pseudo-terminal as stdin, stdout and stderr; (exit code, screen text).
    Past `timeout_s` it is killed and the code is None: what it showed until then still counts."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, close_fds=True,
                            env={**env, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "40"})
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            proc.wait(timeout=60)
            return None, b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", "replace")


def screen_lines(raw: str) -> list[str]:
    """The lines left on the screen: escapes removed; of a line redrawn with \\r, every state
    it showed (a library line flashed onto the live line counts too)."""
    text = ANSI.sub("", raw)
    return [part.strip() for line in text.split("\n") for part in line.split("\r") if part.strip()]


def test_library_output_inside_the_live_display_stays_in_the_log(tmp_path):
    """Inside the display: a logging handler made while it runs (as Dagster's is), print(), a
    warning and a child process's output all go to the log file, not to the terminal."""
    log = tmp_path / "run.log"
    script = textwrap.dedent(f"""
        import logging, subprocess, sys, warnings
        from rich.console import Console
        from orchestration.run_display import RunDisplay, output_to

        with open({str(log)!r}, "a", buffering=1) as logfile, output_to(logfile) as (out, err):
            console = Console(file=err)
            assert console.is_terminal
            with RunDisplay(console) as display:
                display.run_started("downstream_job", None)
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("%(name)s - %(levelname)s - %(message)s"))
                lib = logging.getLogger("dagster-like")
                lib.addHandler(handler)
                lib.setLevel(logging.DEBUG)
                lib.debug("STEP_OUTPUT - Yielded output")
                print("INFO a library's print")
                warnings.warn("a library's DeprecationWarning", UserWarning)
                subprocess.run([sys.executable, "-c", "import sys; print('WARNING from a child', file=sys.stderr)"])
                console.print("  ok kernel_tasks")
    """)
    # a CLI test earlier in this process may have set PYTHONWARNINGS=ignore (quiet_third_parties)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    code, raw = run_in_terminal([sys.executable, "-c", script], {**env, "PYTHONPATH": str(REPO)}, 120)
    assert code == 0, raw
    lines = screen_lines(raw)
    assert "ok kernel_tasks" in lines and any(line.startswith("downstream_job") for line in lines), lines
    assert not [line for line in lines if LIBRARY_LINE.search(line)], lines
    written = log.read_text()
    for text in ("STEP_OUTPUT - Yielded output", "a library's print", "UserWarning", "WARNING from a child"):
        assert text in written

