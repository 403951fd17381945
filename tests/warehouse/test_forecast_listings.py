"""The forecaster listing travels through the warehouse with the forecasts it describes."""

import polars as pl
import pytest

from warehouse.db import connect
from warehouse.errors import ValidationError
from warehouse.forecasts import read_forecast_listing, write_forecast_listing, write_forecasts

LISTING = {"held_out_task": None, "pairs": {"in_distribution": ["p1"]}, "empty": {},
           "forecasters": [{"model_ref": "baseline:uniform", "kind": "baseline", "split": "in_distribution"}]}


def _rows(p1: float) -> pl.DataFrame:
    return pl.DataFrame([{"pair_id": "p1", "model_ref": "baseline:uniform", "parse_ok": True, "predicted_bin": 1,
                          "p": [p1] + [(1 - p1) / 7] * 7, "raw_sum": 1.0}])


def test_a_listing_is_read_back_and_a_missing_one_is_refused_in_one_line(tmp_path):
    with connect(tmp_path / "w.duckdb") as con:
        with pytest.raises(ValidationError, match="no forecaster listing of dataset version ds-1") as err:
            read_forecast_listing(con, "ds-1")
        assert "\n" not in str(err.value)
        write_forecast_listing(con, "ds-1", LISTING)
        write_forecast_listing(con, "ds-1", {**LISTING, "held_out_task": "trimul"})  # a re-run replaces it
        assert read_forecast_listing(con, "ds-1") == {**LISTING, "held_out_task": "trimul"}
        with pytest.raises(ValidationError, match="needs 'pairs'"):
            write_forecast_listing(con, "ds-2", {"forecasters": []})


def test_forecasts_and_their_listing_land_together_or_not_at_all(tmp_path):
    with connect(tmp_path / "w.duckdb") as con:
        with pytest.raises(ValidationError):  # probabilities outside [0, 1]: nothing written
            write_forecasts(con, _rows(1.5), listing=("ds-1", LISTING))
        with pytest.raises(ValidationError, match="no forecaster listing"):
            read_forecast_listing(con, "ds-1")
        assert write_forecasts(con, _rows(0.3), listing=("ds-1", LISTING)) == 1
        assert read_forecast_listing(con, "ds-1")["pairs"] == {"in_distribution": ["p1"]}
