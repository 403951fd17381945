"""Scores, calibration and selective prediction against hand-computed values."""

import math

import numpy as np
import pytest

from pipelines.evaluation import calibration, scores, selective

U = np.full((1, 8), 1 / 8)


def onehot(b):
    p = np.zeros((1, 8))
    p[0, b - 1] = 1.0
    return p


@pytest.mark.parametrize("y", range(1, 9))
def test_uniform_brier_is_0_4375_and_nll_ln8(y):
    assert scores.brier(U, np.array([y]))[0] == pytest.approx(0.4375)
    assert scores.nll(U, np.array([y]))[0] == pytest.approx(math.log(8))
    assert scores.entropy(U)[0] == pytest.approx(math.log(8))


def test_uniform_crps_for_bin_1():
    # (1/7) * sum_{k=1..7} (k/8 - 1)^2 = (1/7) * (1+4+...+49)/64 = 140/448
    assert scores.crps(U, np.array([1]))[0] == pytest.approx(140 / 448)


def test_all_mass_on_one_bin():
    p = onehot(4)
    assert scores.brier(p, np.array([4]))[0] == 0.0
    assert scores.brier(p, np.array([6]))[0] == 1.0
    assert scores.crps(p, np.array([4]))[0] == 0.0
    assert scores.crps(p, np.array([6]))[0] == pytest.approx(2 / 7)  # F_4, F_5 wrong
    assert scores.crps(p, np.array([8]))[0] == pytest.approx(4 / 7)
    assert scores.nll(p, np.array([6]))[0] == pytest.approx(-math.log(1e-12))
    assert scores.entropy(p)[0] == 0.0


def test_two_bin_split():
    p = np.array([[0.5, 0.5, 0, 0, 0, 0, 0, 0]])
    y = np.array([1])
    assert scores.brier(p, y)[0] == pytest.approx(0.25)
    assert scores.crps(p, y)[0] == pytest.approx(0.25 / 7)
    assert scores.nll(p, y)[0] == pytest.approx(math.log(2))
    assert scores.entropy(p)[0] == pytest.approx(math.log(2))


def test_accuracy_uses_stated_bin_not_argmax():
    p = np.array([[0.1, 0.6, 0.3, 0, 0, 0, 0, 0]])
    assert scores.accuracy(np.array([3]), np.array([3]))[0] == 1.0
    assert scores.off_by_one(np.array([3]), np.array([4]))[0] == 1.0
    assert scores.off_by_one(np.array([3]), np.array([5]))[0] == 0.0
    conf = calibration.stated_confidence(p, np.array([3]))
    assert conf[0] == pytest.approx(0.3)


def test_score_means_parse_failure_is_uniform_and_wrong():
    p = np.vstack([onehot(5), np.full((1, 8), np.nan)])
    y = np.array([5, 5])
    m = scores.score_means(p, y, np.array([5, 5]), np.array([True, False]))
    assert m["parse_rate"] == 0.5
    assert m["full"]["brier"] == pytest.approx((0.0 + 0.4375) / 2)
    assert m["full"]["nll"] == pytest.approx(math.log(8) / 2)
    assert m["full"]["accuracy"] == 0.5  # the failure is wrong even though its bin field says 5
    assert m["full"]["off_by_one"] == 0.5
    assert m["parsed"]["brier"] == 0.0
    assert m["parsed"]["accuracy"] == 1.0


def test_ece_hand_computed():
    conf = np.array([0.95, 0.95, 0.35, 0.31])
    correct = np.array([1, 0, 1, 1])
    rel = calibration.reliability(conf, correct)
    # bucket 9: |0.95 - 0.5| * 2/4 ; bucket 3: |0.33 - 1| * 2/4
    assert rel.ece == pytest.approx(0.225 + 0.335)
    assert rel.count.tolist() == [0, 0, 0, 2, 0, 0, 0, 0, 0, 2]
    assert rel.accuracy[9] == 0.5 and math.isnan(rel.accuracy[0])


def test_ece_bucket_edges_and_parsed_only():
    assert calibration.bucket_index(np.array([1.0, 0.1, 0.0999999])).tolist() == [9, 1, 0]
    p = np.vstack([onehot(2), onehot(3)])
    rel = calibration.expected_calibration_error(p, np.array([2, 3]), np.array([2, 1]), np.array([True, False]))
    assert rel.ece == 0.0 and rel.count.sum() == 1


def test_confidence_scores():
    s = selective.confidence_scores(np.vstack([U, onehot(1)]))
    assert s["max_prob"].tolist() == [0.125, 1.0]
    assert s["certainty"] == pytest.approx([0.0, 1.0])
    assert s["margin"] == pytest.approx([0.0, 1.0])


def test_risk_coverage_and_aurc_hand_computed():
    score = np.array([0.9, 0.8, 0.8, 0.1])
    correct = np.array([1, 0, 1, 0])
    rc = selective.risk_coverage(score, correct, np.ones(4, bool))
    assert rc.coverage.tolist() == [0.25, 0.75, 1.0]
    assert rc.risk == pytest.approx([0.0, 1 / 3, 0.5])
    # (0,0)-(0.25,0): 0 ; (0.25,0)-(0.75,1/3): 1/12 ; (0.75,1/3)-(1,1/2): 0.25 * (5/6) / 2
    assert rc.aurc == pytest.approx(1 / 12 + 0.25 * (5 / 6) / 2)
    assert rc.risk_at(0.5) == pytest.approx(1 / 3)  # first point reaching 50%
    assert rc.risk_at(0.25) == 0.0


def test_parse_failures_abstain_and_aurc_is_normalised():
    score = np.array([0.9, 0.8, 0.8, 0.1, 0.99])
    correct = np.array([1, 0, 1, 0, 0])
    ok = np.array([True, True, True, True, False])
    rc = selective.risk_coverage(score, correct, ok)
    assert rc.coverage == pytest.approx([0.2, 0.6, 0.8])  # the failure never enters
    assert rc.aurc == pytest.approx(0.1875)  # same curve shape over 80% coverage
    assert rc.risk_at(0.5) == pytest.approx(1 / 3)
    few = selective.risk_coverage(np.array([0.5, 0.5, 0.5]), np.array([1, 0, 0]), np.array([True, False, False]))
    assert math.isnan(few.risk_at(0.5))  # never reaches 50% coverage


def test_single_distinct_score_aurc_is_error_rate():
    rc = selective.risk_coverage(np.full(4, 0.3), np.array([1, 0, 0, 0]), np.ones(4, bool))
    assert rc.aurc == pytest.approx(0.75)
