"""A forecast cache on disk, so a rerun of the same forecasts costs no model time.

Key: sha256 of the canonical JSON of (model reference, prompt messages, readout, sampling
parameters, repeat index). Anything that could change the answer belongs in the key; the
prompt text itself carries the prompt version. Value: the Forecast as JSON. Storage: one
sqlite file (`forecasts.sqlite`) under the given directory; sqlite's file lock lets several
processes share it, and a lock here lets the backends' threads share one connection.

Parse failures are cached (they are outcomes of the same settings); transport errors are
never cached (the backend raises instead of returning a Forecast).

>>> import tempfile
>>> cache = ForecastCache(tempfile.mkdtemp())
>>> key = cache_key("m", [{"role": "user", "content": "q"}], "logprob", {"temperature": 0}, repeat=0)
>>> cache.get(key) is None
True
>>> cache.put(key, Forecast.failure("no JSON object found"))
>>> cache.get(key).cached, len(cache)
(True, 1)
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.forecast import Forecast

CACHE_FILE = "forecasts.sqlite"
# Part of every key: bump when the Forecast layout or parsing rules change meaning.
CACHE_SCHEMA = "1"


def cache_key(
    model_ref: str,
    messages: Sequence[dict[str, Any]],
    readout: str,
    params: dict[str, Any],
    repeat: int,
) -> str:
    """The sha256 hex digest naming one forecast.

    Args:
        model_ref: what model answers (a path, registry URI or served name + revision).
        messages: the prompt messages.
        readout: "verbalized" or "logprob".
        params: sampling and readout parameters (temperature, max_new_tokens, ...).
        repeat: repeat index (different repeats are different samples).
    Returns:
        64 hex characters.

    >>> cache_key("m", [], "logprob", {"a": 1, "b": 2}, 0) == cache_key("m", [], "logprob", {"b": 2, "a": 1}, 0)
    True
    """
    payload = {
        "schema": CACHE_SCHEMA,
        "model_ref": model_ref,
        "messages": [dict(m) for m in messages],
        "readout": readout,
        "params": params,
        "repeat": int(repeat),
    }
    canonical = json.dumps(
        payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ForecastCache:
    """Forecasts by key in `<directory>/forecasts.sqlite`.

    Args:
        directory: created if missing.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / CACHE_FILE
        self._lock = threading.Lock()
        # check_same_thread=False: backends call from worker threads; self._lock serialises use.
        self._con = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
        with self._lock, self._con:
            self._con.execute(
                "CREATE TABLE IF NOT EXISTS forecasts (key TEXT PRIMARY KEY, forecast TEXT NOT NULL)"
            )
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Forecast | None:
        """The cached forecast (marked cached=True), or None."""
        with self._lock:
            row = self._con.execute(
                "SELECT forecast FROM forecasts WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return Forecast.from_json(json.loads(row[0])).with_meta(cached=True)

    def put(self, key: str, forecast: Forecast) -> None:
        """Store (or replace) one forecast."""
        data = json.dumps(forecast.with_meta(cached=False).to_json())
        with self._lock, self._con:
            self._con.execute(
                "INSERT OR REPLACE INTO forecasts (key, forecast) VALUES (?, ?)", (key, data)
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._con.execute("SELECT count(*) FROM forecasts").fetchone()[0])

    def close(self) -> None:
        """Close the connection (also safe to leave to garbage collection)."""
        with self._lock:
            self._con.close()

    def __getstate__(self) -> dict[str, Any]:
        # Picklable (Dagster resources, multiprocess trainers): reopen from the directory.
        return {"directory": str(self.directory)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])
