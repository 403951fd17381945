"""The registry snapshot a command starts from (pipelines.forecasting.snapshot): what it read from
an unchanged store answers the next command without MLflow, any write to the store makes the next
command read it again, and a cost model comes back with the same forecasts."""

from __future__ import annotations

import os

import numpy as np

from pipelines.forecasting import file_champion_uri
from pipelines.forecasting.load import resolve_version
from pipelines.forecasting.snapshot import RegistrySnapshot, store_state
from tests.forecasting.test_portable_cost_model import fitted, mixed_pairs  # noqa: F401 - the fixture

INFO = {"version": 3, "run_id": "abc123", "tags": {"kind": "cost_model"}, "source": "models:/m-1"}


def _store(tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"a store")
    return f"sqlite:///{db}", db


def test_what_was_read_answers_while_the_store_is_unchanged(tmp_path):
    uri, db = _store(tmp_path)
    snap = RegistrySnapshot(tmp_path, uri)
    snap.remember_alias("kernelcast-surrogate", "champion-external", None)
    snap.remember_alias("kernelcast-surrogate", "champion", 3)
    snap.remember_version("kernelcast-surrogate", 3, INFO)
    # a later command: MLflow is never asked (the store file is not even a database)
    again = RegistrySnapshot(tmp_path, uri)
    assert again.alias("kernelcast-surrogate", "champion-external") == (True, None)
    assert file_champion_uri(uri, snapshot=again) == "models:/kernelcast-surrogate@champion"
    assert resolve_version(uri, "models:/kernelcast-surrogate@champion", again) == ("kernelcast-surrogate", 3, INFO)


def test_any_write_to_the_store_starts_a_new_snapshot(tmp_path):
    uri, db = _store(tmp_path)
    RegistrySnapshot(tmp_path, uri).remember_alias("kernelcast-surrogate", "champion", 3)
    state = store_state(uri)
    with db.open("ab") as f:
        f.write(b" and an alias moved")
    os.utime(db, ns=(state[1] + 1, state[1] + 1))
    assert RegistrySnapshot(tmp_path, uri).alias("kernelcast-surrogate", "champion") == (False, None)
    (tmp_path / "mlflow.db-wal").write_bytes(b"a write in the journal")
    assert store_state(uri) != state


def test_a_store_that_is_not_a_local_file_is_never_kept(tmp_path):
    snap = RegistrySnapshot(tmp_path, "http://127.0.0.1:5000")
    assert not snap.enabled
    snap.remember_alias("kernelcast-surrogate", "champion", 3)
    assert not (tmp_path / "model-cache").exists()


def test_a_cost_model_comes_back_as_its_twin_with_the_same_forecasts(tmp_path, fitted):  # noqa: F811
    uri, _ = _store(tmp_path)
    twin = RegistrySnapshot(tmp_path, uri).keep_cost_model("kernelcast-surrogate", 3, INFO, fitted)
    frame, _, _ = mixed_pairs(100, 7)
    held = RegistrySnapshot(tmp_path, uri).cost_model("kernelcast-surrogate", 3, INFO)
    assert held is not None and np.array_equal(held.predict_proba(frame), fitted.predict_proba(frame))
    assert np.array_equal(twin.predict_proba(frame), fitted.predict_proba(frame))
    # another run registered as version 3 of a registry made anew: not this model
    assert RegistrySnapshot(tmp_path, uri).cost_model("kernelcast-surrogate", 3, {**INFO, "run_id": "def"}) is None
