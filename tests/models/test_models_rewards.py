"""GRPO rewards against hand-computed values; TRL's contract (lists in, one float each out)."""

import json

import numpy as np
import pytest

from models.training.rewards import (
    brier_reward,
    brier_score,
    completion_text,
    correctness_reward,
    crps_reward,
    crps_score,
)

UNIFORM = json.dumps({"predicted_bin": 4, "p": [0.125] * 8})


def one_hot(b, stated=None):
    p = [0.0] * 8
    p[b - 1] = 1.0
    return json.dumps({"predicted_bin": stated or b, "p": p})


def test_uniform_brier_and_crps():
    assert brier_reward([UNIFORM], true_bin=[4]) == [pytest.approx(0.5625)]  # 1 - 0.4375
    # CRPS of uniform with y = 4: F_k = k/8; (1/7) * [sum_{k<4} (k/8)^2 + sum_{k=4..7} (k/8 - 1)^2]
    expected = (
        sum((k / 8) ** 2 for k in (1, 2, 3)) + sum((k / 8 - 1) ** 2 for k in (4, 5, 6, 7))
    ) / 7
    assert crps_reward([UNIFORM], true_bin=[4]) == [pytest.approx(1 - expected)]


def test_one_hot_correct_scores_one_everywhere():
    for y in range(1, 9):
        c = [one_hot(y)]
        assert correctness_reward(c, true_bin=[y]) == [1.0]
        assert brier_reward(c, true_bin=[y]) == [1.0]
        assert crps_reward(c, true_bin=[y]) == [1.0]


def test_one_hot_far_miss():
    assert brier_reward([one_hot(1)], true_bin=[8]) == [0.0]  # Brier 1
    assert crps_reward([one_hot(1)], true_bin=[8]) == [0.0]  # F_k = 1 for k = 1..7, all wrong
    assert crps_reward([one_hot(4)], true_bin=[5]) == [pytest.approx(1 - 1 / 7)]


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "no json",
        '{"predicted_bin": 4, "p": [1, 0]}',
        json.dumps({"predicted_bin": 4, "p": [0] * 8}),
    ],
)
def test_parse_failure_scores_zero_in_every_part(bad):
    for reward in (
        correctness_reward,
        brier_reward,
        crps_reward,
    ):
        assert reward([bad], true_bin=[4]) == [0.0]


def test_stated_bin_counts_not_argmax():
    stated_5_mass_on_4 = one_hot(4, stated=5)
    assert correctness_reward([stated_5_mass_on_4], true_bin=[5]) == [1.0]
    assert brier_reward([stated_5_mass_on_4], true_bin=[5]) == [0.0]


def test_scores_match_numpy_reference():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.dirichlet(np.ones(8))
        y = int(rng.integers(1, 9))
        onehot = np.eye(8)[y - 1]
        assert brier_score(p, y) == pytest.approx(0.5 * np.sum((p - onehot) ** 2))
        cdf, step = np.cumsum(p)[:7], (np.arange(1, 8) >= y).astype(float)
        assert crps_score(p, y) == pytest.approx(np.sum((cdf - step) ** 2) / 7)


def test_conversational_completions_read_last_assistant_message():
    chat = [
        [
            {"role": "assistant", "content": "thinking..."},
            {"role": "assistant", "content": one_hot(3)},
        ]
    ]
    assert correctness_reward(chat, true_bin=[3]) == [1.0]
    assert (
        completion_text([{"role": "user", "content": "q"}]) == "q"
    )  # no assistant turn: last message
    assert completion_text({"content": "x"}) == "x"


def test_batch_lengths_must_match():
    with pytest.raises(ValueError):
        brier_reward([UNIFORM, UNIFORM], true_bin=[4])


def test_missing_true_bin_is_not_applicable_and_bad_bin_raises():
    assert brier_reward([UNIFORM], true_bin=[None]) == [None]
    with pytest.raises(ValueError):
        correctness_reward([UNIFORM], true_bin=[9])
    assert correctness_reward([UNIFORM], true_bin=[np.int64(4)]) == [1.0]


def test_trainer_logging_hooks():
    columns, metrics = {}, {}
    correctness_reward(
        [UNIFORM, "nope"],
        true_bin=[4, 4],
        log_extra=lambda name, values: columns.setdefault(name, values),
        log_metric=lambda name, value: metrics.setdefault(name, value),
        trainer_state=None,
        prompt=["a", "b"],
    )
    assert columns["predicted_bin"] == [4, None]
    assert columns["parse_error"] == ["", "no JSON object found"]
    assert metrics["parse_rate"] == 0.5


def test_trl_names_the_curves():
    from trl.trainer.utils import get_callable_name

    assert [get_callable_name(f) for f in (correctness_reward, brier_reward)] == [
        "correctness_reward",
        "brier_reward",
    ]
