"""evaluate: uneven repeats weigh every pair the same; text where numbers belong is refused."""

from __future__ import annotations

import polars as pl
import pytest

from pipelines.evaluation import evaluate_forecasts

UNIFORM = [0.125] * 8


def _rows(pair: str, s: float, ps: list[list[float]]) -> list[dict]:
    return [{"pair_id": pair, "task": "t", "true_speedup": s, "repeat": r, **{f"p{i + 1}": p[i] for i in range(8)}}
            for r, p in enumerate(ps)]


def _onehot(b: int) -> list[float]:
    p = [0.0] * 8
    p[b - 1] = 1.0
    return p


def test_uneven_repeats_weigh_every_pair_the_same():
    # S = 1.2 is bin 5, S = 0.6 bin 3. Pair a: three uniform forecasts (Brier 0.4375 each);
    # pair b: one exact forecast (Brier 0). Each pair counts once: (0.4375 + 0) / 2.
    frame = pl.DataFrame(_rows("a", 1.2, [UNIFORM] * 3) + _rows("b", 0.6, [_onehot(3)]))
    res = evaluate_forecasts(frame, n_boot=0)
    assert res["brier"] == pytest.approx(0.4375 / 2)
    assert res["n"] == 4 and res["n_pairs"] == 2  # the rows given, not the virtual ones


def test_uneven_repeats_average_a_pairs_own_forecasts_first():
    # pair a: 2 forecasts (exact, uniform) -> mean Brier 0.21875; pair b: 3 (exact, exact, uniform)
    # -> 0.4375 / 3. lcm(2, 3) = 6 virtual repeats make both exact.
    frame = pl.DataFrame(_rows("a", 1.2, [_onehot(5), UNIFORM]) + _rows("b", 0.6, [_onehot(3), _onehot(3), UNIFORM]))
    res = evaluate_forecasts(frame, n_boot=10)
    assert res["brier"] == pytest.approx((0.4375 / 2 + 0.4375 / 3) / 2)
    assert res["accuracy"] == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_repeat_labels_need_not_match_across_pairs():
    same = pl.DataFrame(_rows("a", 1.2, [UNIFORM, _onehot(5)]) + _rows("b", 0.6, [_onehot(3), UNIFORM]))
    shifted = same.with_columns(pl.when(pl.col("pair_id") == "b").then(pl.col("repeat") + 7).otherwise(pl.col("repeat"))
                                .alias("repeat"))
    assert evaluate_forecasts(shifted, n_boot=0)["brier"] == pytest.approx(evaluate_forecasts(same, n_boot=0)["brier"])


def test_too_uneven_repeats_are_refused_in_one_line():
    rows = []
    for i, k in enumerate((7, 8, 9)):  # lcm 504
        rows += _rows(f"p{i}", 1.2, [UNIFORM] * k)
    with pytest.raises(ValueError, match="virtual repeats") as err:
        evaluate_forecasts(pl.DataFrame(rows), n_boot=0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("column", ["p3", "true_speedup", "repeat", "predicted_bin", "parse_ok"])
def test_text_in_numeric_columns_is_refused(column):
    frame = pl.DataFrame(_rows("a", 1.2, [UNIFORM]) + _rows("b", 0.6, [UNIFORM]))
    if column == "predicted_bin":
        frame = frame.with_columns(pl.lit(5).alias("predicted_bin"))
    if column == "parse_ok":
        frame = frame.with_columns(pl.lit(True).alias("parse_ok"))
    frame = frame.with_columns(pl.col(column).cast(pl.Utf8))
    with pytest.raises(ValueError, match=f"column {column} is String") as err:
        evaluate_forecasts(frame, n_boot=0)
    assert "\n" not in str(err.value)
