"""The cross-hardware page: the tables, the curve PNG and the summary JSON of card studies, the
headline `kernelcast report` prints from it."""

from __future__ import annotations

import json
from types import SimpleNamespace

from pipelines.evaluation.cross_hardware import headline, write_cross_hardware_report

CARD, REF = "nvidia-h100-80gb-hbm3-sm90", "nvidia-h200-sm90"


def _study() -> dict:
    def s(b, n=50):
        return {"n": n, "brier": b, "crps": b / 3, "nll": 2 * b, "accuracy": 1 - b, "off_by_one": 1.0, "ece": 0.05}

    settings = {"zero_shot": {"baseline:uniform": s(0.4375), "cost_model": {**s(0.41), "brier_ci": [0.39, 0.43]},
                              "text_model": s(0.44)},
                "calibrated@100": {"cost_model": s(0.36), "text_model": s(0.40)},
                "calibrated@300": {"cost_model": s(0.33), "text_model": s(0.38)},
                "calibrated@all": {"cost_model": s(0.35), "text_model": s(0.39)},
                "fitted@100": {"baseline:bin_prior": s(0.45), "cost_model": s(0.40)},
                "fitted@all": {"baseline:bin_prior": s(0.47), "cost_model": s(0.30)}}
    curve = [{"setting": "zero_shot", "forecaster": k, "n": 0, "pairs": 0, "brier": settings["zero_shot"][k]["brier"]}
             for k in ("cost_model", "text_model")]
    for name, part in settings.items():
        if "@" in name:
            kind, n = name.split("@")
            for k, r in part.items():
                if not k.startswith("baseline:"):
                    curve.append({"setting": kind, "forecaster": k, "n": None if n == "all" else int(n),
                                  "pairs": 900 if n == "all" else int(n), "brier": r["brier"]})
    return {"hardware_id": CARD, "reference_hardware": REF, "eval_pairs": 50, "pool_pairs": 900,
            "learned_left_out": 3, "settings": settings,
            "models": {"reference": {"cost_model": "models:/kernelcast-surrogate/1"},
                       "card": {"cost_model": "models:/kernelcast-surrogate/7"}},
            "curve": curve, "notes": ["a note"],
            "agreement": {"n": 20, "rows": [{"task": "softmax", "n": 20, "same": 0.9, "within_one": 1.0,
                                             "mean_shift": 0.1, "median_ratio": 1.02},
                                            {"task": "all", "n": 20, "same": 0.9, "within_one": 1.0,
                                             "mean_shift": 0.1, "median_ratio": 1.02}]},
            "reference_scores": {"cost_model": {"in_distribution": 0.296, "external": 0.247},
                                 "text_model": {"in_distribution": 0.391, "external": 0.259}}}


def test_the_headline_takes_the_best_of_each_setting_and_the_gap_of_its_kind():
    h = headline(_study())
    assert h["zero_shot"] == ("cost_model", 0.41)
    assert h["calibrated"] == ("cost_model", 0.33, 300)  # the largest size of at most 300 pairs
    assert h["calibrated_gap"] == round(0.33 - 0.296, 4)
    assert h["fitted"] == ("cost_model", 0.30) and h["same_bin"] == 0.9


def test_the_page_the_curve_and_the_summary_are_written(tmp_path):
    page = write_cross_hardware_report([_study()], tmp_path, "ds-x", ("run1", "http://x"))
    html = page.read_text()
    assert page == tmp_path / "cross_hardware" / "index.html"
    for text in (CARD, "zero shot", "recalibrated on the first 300 pairs", "[0.3900, 0.4300]", "same bin", "0.2960",
                 "data:image/png;base64,", "run1"):
        assert text in html, text
    png = tmp_path / "cross_hardware" / f"curve-{CARD}.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "cross_hardware" / "cross_hardware.json").read_text())
    assert summary["dataset_version"] == "ds-x" and summary["cards"][0]["hardware_id"] == CARD


def test_an_empty_study_list_still_writes_a_page_that_says_so(tmp_path):
    page = write_cross_hardware_report([], tmp_path, "ds-y")
    assert "No card but the reference card" in page.read_text()


def test_report_prints_three_lines_per_card_within_100_columns(tmp_path):
    from orchestration.cli_report import cross_hardware_lines

    settings = SimpleNamespace(reports_dir=tmp_path)
    assert cross_hardware_lines(settings, "ds-x") == ([], [])
    write_cross_hardware_report([_study()], tmp_path / "ds-x", "ds-x")
    lines, heads = cross_hardware_lines(settings, "ds-x")
    assert lines[:3] == [f"cross-hardware {CARD} (same bin on both cards: 90.0% of kernels):",
                         "  zero shot cost_model 0.410; calibrated cost_model 0.330 on 300 pairs (+0.034 from in distribution)",
                         "  fitted on all its pairs cost_model 0.300"]
    assert lines[3] == f"  page: {tmp_path / 'ds-x' / 'cross_hardware' / 'index.html'}" and heads[0]["hardware_id"] == CARD
    assert all(len(line) <= 100 for line in lines[:3])
    summary = tmp_path / "ds-x" / "cross_hardware" / "cross_hardware.json"
    summary.write_text(summary.read_text()[:50])  # cut short
    lines, heads = cross_hardware_lines(settings, "ds-x")
    assert heads == [] and len(lines) == 1 and lines[0].startswith("cross-hardware: ") and "unreadable" in lines[0]
