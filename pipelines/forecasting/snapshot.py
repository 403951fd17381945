"""What a command reads from the model registry, kept in the home so the next one starts without MLflow.

`kernelcast forecast` on one file spent most of its start-up on the registry: importing MLflow
and opening its store to learn which version an alias names, then importing scikit-learn and
skops (whose first import looks through every loaded module and so imports torch) to load a
cost model of a few hundred kB. What the command needs is small, and it changes only when the
store does. `RegistrySnapshot` keeps it under <home>/model-cache:

- registry.json: the aliases and versions read so far (an alias that names nothing too), and
  the state of the store they were read from: size and modification time of the SQLite file
  and of its journal. Any write to the store (a version registered, an alias moved, a run
  logged) changes that state, and the next command reads the registry through MLflow again;
- a cost model as its portable twin (models.classical.portable.PortableCostModel, numpy and
  pandas only, the same forecasts to the last bit), saved as arrays and JSON, so loading it
  runs no code, as skops does not. Its file is named by the model, version, and the run that
  logged it: a registry made anew, whose version 1 is another model, does not reuse it.

Other kinds (text model, ensemble, language models) load through MLflow as before, and a store
that is not a local SQLite file is never kept here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

SNAPSHOT_DIR = "model-cache"  # under the home
_INDEX = "registry.json"
_SAFE = re.compile(r"[^\w.-]")  # what a file name keeps of a model name or run id


def store_state(tracking_uri: str) -> list[int] | None:
    """Size and modification time (ns) of a SQLite store's file and journals, or None when the
    store is not a local SQLite file (nothing is kept for it) or does not exist yet."""
    from models.registry.tracking import sqlite_path

    db = sqlite_path(tracking_uri)
    if db is None or not db.is_file():
        return None
    state: list[int] = []
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-journal")):
        try:
            st = path.stat()
        except FileNotFoundError:
            state += [-1, -1]
        else:
            state += [st.st_size, st.st_mtime_ns]
    return state


class RegistrySnapshot:
    """The registry as last read from one store, in <home>/model-cache.

    Args:
        home: the KERNELCAST_HOME whose model-cache holds the snapshot.
        tracking_uri: the store it is a snapshot of.
    """

    def __init__(self, home: str | Path, tracking_uri: str):
        self.folder = Path(home) / SNAPSHOT_DIR
        self.tracking_uri = tracking_uri
        self.state = store_state(tracking_uri)  # before anything is read from the store
        self._index: dict[str, Any] = {"uri": tracking_uri, "state": self.state, "aliases": {}, "versions": {},
                                       "model_tags": {}}
        if self.state is None:
            return
        try:
            held = json.loads((self.folder / _INDEX).read_text())
        except (OSError, ValueError):
            return
        if isinstance(held, dict) and held.get("uri") == tracking_uri and held.get("state") == self.state:
            self._index["aliases"] = dict(held.get("aliases") or {})
            self._index["versions"] = dict(held.get("versions") or {})
            self._index["model_tags"] = dict(held.get("model_tags") or {})

    @property
    def enabled(self) -> bool:
        return self.state is not None

    # ---- aliases and versions ---------------------------------------------------------------
    def alias(self, name: str, alias: str) -> tuple[bool, int | None]:
        """(known, version): whether the snapshot read this alias, and the version it names
        (None: it names none)."""
        key = f"{name}@{alias}"
        held = self._index["aliases"]
        return (key in held, held.get(key))

    def version(self, name: str, version: int) -> dict[str, Any] | None:
        """The version's info as models.registry.versions.version_info gave it, if read before."""
        return self._index["versions"].get(f"{name}/{int(version)}")

    def model_tag(self, name: str, key: str) -> tuple[bool, str | None]:
        """(known, value) of a registered model's tag as read before (None: not set)."""
        key = f"{name}#{key}"
        held = self._index["model_tags"]
        return (key in held, held.get(key))

    def remember_model_tag(self, name: str, key: str, value: str | None) -> None:
        self._index["model_tags"][f"{name}#{key}"] = value
        self._save()

    def remember_alias(self, name: str, alias: str, version: int | None) -> None:
        self._index["aliases"][f"{name}@{alias}"] = None if version is None else int(version)
        self._save()

    def remember_version(self, name: str, version: int, info: dict[str, Any]) -> None:
        self._index["versions"][f"{name}/{int(version)}"] = info
        self._save()

    def _save(self) -> None:
        """Write the index, unless the store changed since this snapshot began (what was read
        may predate the change; the next command reads it again)."""
        if self.state is None or store_state(self.tracking_uri) != self.state:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f"{_INDEX}.{os.getpid()}.part"
            tmp.write_text(json.dumps(self._index, sort_keys=True))
            tmp.replace(self.folder / _INDEX)
        except OSError:
            pass  # a read-only home: every command reads the registry, as without a snapshot

    # ---- cost models ------------------------------------------------------------------------
    def _model_path(self, name: str, version: int, info: dict[str, Any]) -> Path:
        run = _SAFE.sub("_", str(info.get("run_id") or "no-run"))
        return self.folder / f"{_SAFE.sub('_', name)}-v{int(version)}-{run}.cost_model.npz"

    def cost_model(self, name: str, version: int, info: dict[str, Any]) -> Any | None:
        """The version's cost model as its portable twin, if kept here before (else None)."""
        from models.classical.portable import PortableCostModel

        path = self._model_path(name, version, info)
        if self.state is None or not path.is_file():
            return None
        try:
            return PortableCostModel.load(path)
        except ValueError:
            return None  # damaged or of another format: loaded from the registry again

    def keep_cost_model(self, name: str, version: int, info: dict[str, Any], model: Any) -> Any:
        """`model` (a fitted CostModel) as its portable twin, kept for the next command; the twin
        is returned so this command forecasts exactly as the next ones will."""
        from models.classical.portable import PortableCostModel

        portable = PortableCostModel.from_cost_model(model, name=f"models:/{name}/{int(version)}")
        if self.state is None:
            return portable
        path = self._model_path(name, version, info)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
            portable.save(tmp)
            tmp.replace(path)
        except OSError:
            pass
        return portable
