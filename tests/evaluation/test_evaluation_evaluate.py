"""evaluate_forecasts / evaluate_file end to end, baselines, and the HTML report."""

import json
import math

import numpy as np
import polars as pl
import pytest

from models.baselines import bin_prior, bin_prior_forecasts, oracle_forecasts, uniform_forecasts
from pipelines.evaluation import evaluate_file, evaluate_forecasts, write_report

KEYS = [
    "n", "parse_rate", "brier", "crps", "nll", "accuracy", "off_by_one", "ece", "aurc",
    "selective_risk_at_50", "recovered_mean", "recovered_at_10", "within_20", "recovered_random_mean",
]


def pairs_frame(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "pair_id": [f"p{i:03d}" for i in range(n)],
        "task": [f"t{i % 2}" for i in range(n)],
        "hardware_id": "h",
        "anchor_kernel_id": [f"ref{i % 2}" for i in range(n)],
        "candidate_kernel_id": [f"k{i:03d}" for i in range(n)],
        "speedup": np.exp(rng.normal(0, 1.2, n)),
    })


def forecasts(rows):
    """rows: list of (pair_id, task, S, p or None, predicted_bin, parse_ok)."""
    data = {"pair_id": [], "task": [], "true_speedup": [], "predicted_bin": [], "parse_ok": []}
    data.update({f"p{i}": [] for i in range(1, 9)})
    for pid, task, s, p, b, ok in rows:
        for key, value in zip(("pair_id", "task", "true_speedup", "predicted_bin", "parse_ok"), (pid, task, s, b, ok)):
            data[key].append(value)
        for i in range(8):
            data[f"p{i + 1}"].append(None if p is None else p[i])
    return pl.DataFrame(data)


def test_keys_and_uniform_values():
    res = evaluate_forecasts(uniform_forecasts(pairs_frame()), n_boot=20)
    for k in KEYS:
        assert k in res
        for t in res["per_task"].values():
            assert k in t
    assert res["brier"] == pytest.approx(0.4375)
    assert res["nll"] == pytest.approx(math.log(8))
    assert res["intervals"]["brier"] == pytest.approx([0.4375, 0.4375])
    assert res["parse_rate"] == 1.0 and res["n"] == 24 and set(res["per_task"]) == {"t0", "t1"}
    json.dumps(res)  # JSON-ready (NaN written as null)


def test_oracle_scores_perfectly():
    res = evaluate_forecasts(oracle_forecasts(pairs_frame()), n_boot=0)
    assert res["brier"] == 0.0 and res["accuracy"] == 1.0 and res["ece"] == 0.0 and res["aurc"] == 0.0
    assert res["intervals"]["brier"] is None  # n_boot=0 skips the bootstrap
    assert res["recovered_oracle_mean"] == 1.0


def test_parse_failures_predicted_bin_and_hand_values():
    p_a = [0.0] * 8
    p_a[4] = 1.0  # all on bin 5
    p_b = [0.1, 0.6, 0.3, 0, 0, 0, 0, 0]  # argmax 2, states 3
    f = forecasts([
        ("a", "t", 1.2, p_a, 5, True),  # S=1.2 -> bin 5: right
        ("b", "t", 0.6, p_b, 3, True),  # S=0.6 -> bin 3: right by the stated bin
        ("c", "t", 3.0, None, None, False),  # parse failure
    ])
    res = evaluate_forecasts(f, n_boot=0)
    brier_b = 0.5 * (0.01 + 0.36 + 0.49)
    assert res["parse_rate"] == pytest.approx(2 / 3)
    assert res["brier"] == pytest.approx((0 + brier_b + 0.4375) / 3)
    assert res["accuracy"] == pytest.approx(2 / 3)
    assert res["parsed_only"]["accuracy"] == 1.0
    assert res["parsed_only"]["brier"] == pytest.approx(brier_b / 2)
    # ECE over parsed: conf 1.0 (bucket 9, acc 1), conf 0.3 (bucket 3, acc 1)
    assert res["ece"] == pytest.approx(0.5 * 0.7)
    # Utility: a scores 0.25, b scores -1.5*.6 - .75*.3 - 2.5*.1, c fails -> order a, b, c.
    # n=3: k=1 for f<=33% -> 1.2/3, k=2 up to 50% -> 1.2/3
    assert res["recovered_mean"] == pytest.approx(0.4)


def test_default_argmax_repeat_and_spread():
    f = uniform_forecasts(pairs_frame(8)).drop("predicted_bin", "repeat", "model")
    g = oracle_forecasts(pairs_frame(8)).drop("predicted_bin", "repeat", "model")
    both = pl.concat([f.with_columns(pl.lit(0).alias("repeat")), g.with_columns(pl.lit(1).alias("repeat"))])
    res = evaluate_forecasts(both, n_boot=10)
    assert res["n_repeats"] == 2 and res["n_pairs"] == 8
    assert res["brier"] == pytest.approx(0.4375 / 2)
    assert res["spread"]["brier"] == pytest.approx(np.std([0.4375, 0.0], ddof=1))


def test_parent_rows_feed_discovery():
    pf = pairs_frame(10).with_columns(
        pl.Series("pair_type", ["parent" if i < 4 else "reference" for i in range(10)])
    )
    res = evaluate_forecasts(oracle_forecasts(pf), n_boot=0)
    assert res["n"] == 6 and res["discovery"]["n"] == 4
    assert res["discovery"]["pr_auc"] in (1.0, None)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda f: f.drop("p3"), "missing column"),
        (lambda f: f.with_columns(pl.lit(0.5).alias("p1")), "do not sum to 1"),
        (lambda f: f.with_columns(pl.lit(-0.1).alias("p1")), "outside [0, 1]"),
        (lambda f: f.with_columns(pl.lit(0.0).alias("true_speedup")), "true_speedup"),
        (lambda f: f.with_columns(pl.lit(9).alias("predicted_bin")), "predicted_bin"),
        (lambda f: pl.concat([f, f]), "duplicated"),
    ],
)
def test_bad_input_is_one_line_value_error(mutate, message):
    with pytest.raises(ValueError) as exc:
        evaluate_forecasts(mutate(uniform_forecasts(pairs_frame(4))), n_boot=0)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_evaluate_file(tmp_path):
    path = tmp_path / "f.parquet"
    uniform_forecasts(pairs_frame()).write_parquet(path)
    assert evaluate_file(path, n_boot=0)["brier"] == pytest.approx(0.4375)
    with pytest.raises(ValueError, match="not found"):
        evaluate_file(tmp_path / "missing.parquet")


def test_bin_prior_is_laplace_smoothed_per_task():
    train = pl.DataFrame({"task": ["t0"] * 2 + ["t1"], "speedup": [1.2, 1.3, 0.3]})
    prior = bin_prior(train)
    assert prior["t0"][4] == pytest.approx(3 / 10) and prior["t1"][1] == pytest.approx(2 / 9)
    f = bin_prior_forecasts(pl.DataFrame({"pair_id": ["x", "y"], "task": ["t0", "new"], "speedup": [1.1, 1.1]}), train)
    assert f["p5"].to_list() == pytest.approx([0.3, 3 / 11])  # unseen task: pooled prior
    assert f["predicted_bin"].to_list() == [5, 5]


def test_report_html_with_images(tmp_path):
    pf = pairs_frame()
    results = {
        "uniform": evaluate_forecasts(uniform_forecasts(pf), n_boot=20),
        "oracle": evaluate_forecasts(oracle_forecasts(pf), n_boot=20),
    }
    path = write_report(results, tmp_path / "report")
    html = path.read_text()
    assert path.name == "index.html"
    assert html.count("<img") == 3 and "data:image/png;base64," in html
    assert "uniform" in html and "t1" in html
    assert (tmp_path / "report" / "recovered.png").read_bytes()[:4] == b"\x89PNG"


def test_warehouse_shaped_frame_and_one_model_at_a_time():
    f = uniform_forecasts(pairs_frame(6)).rename({"true_speedup": "speedup"})
    assert evaluate_forecasts(f, n_boot=0)["brier"] == pytest.approx(0.4375)
    two = pl.concat([uniform_forecasts(pairs_frame(4)), oracle_forecasts(pairs_frame(4))])
    with pytest.raises(ValueError, match="evaluate one at a time"):
        evaluate_forecasts(two, n_boot=0)


def test_per_task_intervals_bracket_the_task_estimate():
    import numpy as np
    import polars as pl

    from pipelines.evaluation.evaluate import evaluate_forecasts

    rng = np.random.default_rng(1)
    n = 60
    p = rng.dirichlet(np.ones(8), size=n)
    frame = pl.DataFrame({"pair_id": [f"p{i}" for i in range(n)], "task": ["a", "b", "c"] * 20,
                          "true_speedup": rng.lognormal(0, 1, n), **{f"p{i + 1}": p[:, i] for i in range(8)}})
    result = evaluate_forecasts(frame, n_boot=200)
    for task, block in result["per_task"].items():
        lo, hi = block["intervals"]["brier"]
        assert lo <= block["brier"] <= hi, task
        assert hi - lo > 0
