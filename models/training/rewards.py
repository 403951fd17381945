"""GRPO rewards for the surrogate, in TRL's reward-function contract (method.md section 5).

Each reward takes the batch's `completions` plus dataset columns by name (here `true_bin`,
1..8) and `**kwargs`, and returns one float per completion. A completion is either a string
(standard format) or a list of chat messages (conversational format; the last assistant
message is read). A completion that does not parse scores 0.0 in every part; a row whose
`true_bin` is missing scores None (TRL: "not applicable").

- correctness = 1[predicted_bin == y] (the stated bin, not the argmax)
- brier       = 1 - Brier, Brier = 0.5 * sum_b (p_b - 1[b=y])^2 (halved, in [0, 1])
- crps        = 1 - CRPS, CRPS = (1/7) * sum_{k=1..7} (F_k - 1[k>=y])^2 (ordinal)

"correctness+brier" = correctness + w * (1 - Brier). In TRL the preferred form is two reward
functions with weights, which logs one curve per part (`rewards/correctness_reward/mean`,
`rewards/brier_reward/mean`):

    GRPOTrainer(..., reward_funcs=[correctness_reward, brier_reward],
                args=GRPOConfig(..., reward_weights=[1.0, w]))

>>> uniform = '{"predicted_bin": 4, "p": [0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125]}'
>>> brier_reward([uniform], true_bin=[4]), correctness_reward([uniform, "no answer"], true_bin=[4, 4])
([0.5625], [1.0, 0.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from models.bins import NUM_BINS
from models.forecast import Forecast
from models.parsing import parse_forecast

Completion = str | list[dict[str, Any]]


def completion_text(completion: Completion | dict[str, Any]) -> str:
    """The answer text of one completion: a string, a message, or a list of messages.

    >>> completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    'a'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    messages = list(completion or [])
    assistant = [
        m for m in messages if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
    ]
    last = (assistant or messages or [{}])[-1]
    return str(last.get("content") or "") if isinstance(last, dict) else str(last)


def _true_bin(value: Any) -> int | None:
    """A dataset's true bin as int 1..8; None when missing (the row scores None)."""
    if value is None:
        return None
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    b = int(value)
    if not 1 <= b <= NUM_BINS:
        raise ValueError(f"true_bin must be in 1..{NUM_BINS}, got {value!r}")
    return b


def brier_score(p: Sequence[float], y: int) -> float:
    """Halved Brier score 0.5 * sum_b (p_b - 1[b=y])^2, in [0, 1].

    >>> brier_score([0.125] * 8, 3), brier_score([0, 0, 1, 0, 0, 0, 0, 0], 3)
    (0.4375, 0.0)
    """
    return 0.5 * math.fsum((pb - (1.0 if b + 1 == y else 0.0)) ** 2 for b, pb in enumerate(p))


def crps_score(p: Sequence[float], y: int) -> float:
    """Ordinal CRPS (1/7) * sum_{k=1..7} (F_k - 1[k >= y])^2, F_k the cumulative p.

    >>> round(crps_score([0, 0, 0, 1, 0, 0, 0, 0], 5), 6)  # one bin off
    0.142857
    """
    cdf, total = 0.0, 0.0
    for k in range(1, NUM_BINS):
        cdf += p[k - 1]
        total += (cdf - (1.0 if k >= y else 0.0)) ** 2
    return total / (NUM_BINS - 1)


def _score(forecast: Forecast, y: int | None, part: str) -> float | None:
    """One part of the reward for one parsed (or failed) forecast."""
    if y is None:
        return None
    if not forecast.parse_ok or forecast.p is None:
        return 0.0
    if part == "correctness":
        return 1.0 if forecast.predicted_bin == y else 0.0
    if part == "brier":
        return 1.0 - brier_score(forecast.p, y)
    if part == "crps":
        return 1.0 - crps_score(forecast.p, y)
    raise ValueError(f"unknown reward part {part!r}")


def _parse_all(completions: Sequence[Completion]) -> list[Forecast]:
    return [parse_forecast(completion_text(c)) for c in completions]


def correctness_reward(
    completions: Sequence[Completion],
    true_bin: Sequence[int],
    log_extra: Callable[[str, list], None] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the stated predicted_bin equals the true bin, else 0.0 (parse failure: 0.0).

    Args:
        completions: one completion per sample (text or chat messages).
        true_bin: the dataset column, bins 1..8.
        log_extra: given by GRPOTrainer; logs the parsed bin and parse status as columns of
            the completions table (only this reward logs them, so columns are not doubled).
        log_metric: given by GRPOTrainer; logs the batch parse rate.
        **kwargs: other dataset columns and trainer state, unused.
    Returns:
        One float per completion (None where true_bin is None).

    >>> correctness_reward(['{"predicted_bin": 2, "p": [0, 1, 0, 0, 0, 0, 0, 0]}'], true_bin=[3])
    [0.0]
    """
    forecasts = _parse_all(completions)
    rewards = [
        _score(f, _true_bin(y), "correctness") for f, y in zip(forecasts, true_bin, strict=True)
    ]
    if log_extra is not None:
        log_extra("predicted_bin", [f.predicted_bin for f in forecasts])
        log_extra("parse_error", [f.parse_error or "" for f in forecasts])
    if log_metric is not None and forecasts:
        log_metric("parse_rate", sum(f.parse_ok for f in forecasts) / len(forecasts))
    return rewards


def brier_reward(
    completions: Sequence[Completion], true_bin: Sequence[int], **kwargs: Any
) -> list[float | None]:
    """1 - halved Brier score of the renormalised p (parse failure: 0.0).

    Args:
        completions: one completion per sample (text or chat messages).
        true_bin: the dataset column, bins 1..8.
        **kwargs: other dataset columns and trainer state, unused.
    Returns:
        One float in [0, 1] per completion (None where true_bin is None).

    >>> brier_reward(['{"predicted_bin": 3, "p": [0, 0, 1, 0, 0, 0, 0, 0]}', "{}"], true_bin=[3, 3])
    [1.0, 0.0]
    """
    return [
        _score(f, _true_bin(y), "brier")
        for f, y in zip(_parse_all(completions), true_bin, strict=True)
    ]


def crps_reward(
    completions: Sequence[Completion], true_bin: Sequence[int], **kwargs: Any
) -> list[float | None]:
    """1 - ordinal CRPS of the renormalised p (parse failure: 0.0); near misses score more.

    Args:
        completions: one completion per sample (text or chat messages).
        true_bin: the dataset column, bins 1..8.
        **kwargs: other dataset columns and trainer state, unused.
    Returns:
        One float in [0, 1] per completion (None where true_bin is None).

    >>> [round(r, 4) for r in crps_reward(['{"predicted_bin": 4, "p": [0, 0, 0, 1, 0, 0, 0, 0]}'] * 2,
    ...                                     true_bin=[5, 8])]
    [0.8571, 0.4286]
    """
    return [
        _score(f, _true_bin(y), "crps")
        for f, y in zip(_parse_all(completions), true_bin, strict=True)
    ]
