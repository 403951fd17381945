"""Post-hoc calibration of an eight-bin forecaster (method.md section 5b).

A `Calibrator` maps a forecaster's distribution p (n, 8) to softmax(log(p) / T + b): a
temperature T > 0 that sharpens (T < 1) or flattens (T > 1) every forecast, and optional
per-bin biases b (vector scaling) that shift mass between bins. Both are fitted on a
calibration split carved from the TRAINING lineages (pipelines.curation.splits), never on
eval pairs, and stored with the model version, so every backend applies the same map.

Why biases at all: the training pool is skewed towards fast kernels (bins 7-8 hold over half
of it) while the calibration split is drawn bin-balanced per task, as the eval set is; biases
fitted there correct the prior a model picked up from the pool (label shift), which a
temperature alone cannot.

>>> import numpy as np
>>> c = Calibrator(temperature=2.0)
>>> q = c.apply(np.array([[0.9, 0.1, 0, 0, 0, 0, 0, 0]]))
>>> bool(q[0, 0] < 0.9), round(float(q.sum()), 6)
(True, 1.0)
>>> Calibrator.from_dict(c.to_dict()) == c
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from models.bins import NUM_BINS

Objective = Literal["nll", "brier"]
EPS = 1e-9  # floor on probabilities before the log: a hard zero must stay finite
BIAS_L2 = 1e-3  # ridge on the biases: bins rare in the calibration split must not run off


@dataclass(frozen=True)
class Calibrator:
    """softmax(log(p) / temperature + bias) over the eight bins.

    Attributes:
        temperature: T > 0; 1 leaves p as it is.
        bias: eight additive log-space biases (all 0: none).
        objective: what the fit minimised ("nll" or "brier").
        n_fit: calibration pairs it was fitted on (0: not fitted).
    """

    temperature: float = 1.0
    bias: tuple[float, ...] = field(default=(0.0,) * NUM_BINS)
    objective: str = "nll"
    n_fit: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature}")
        if len(self.bias) != NUM_BINS or not all(math.isfinite(b) for b in self.bias):
            raise ValueError(f"bias must be {NUM_BINS} finite numbers, got {self.bias}")

    @property
    def is_identity(self) -> bool:
        return self.temperature == 1.0 and not any(self.bias)

    def apply(self, p: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """Calibrated probabilities, (n, 8), each row summing to 1."""
        return calibrated(np.asarray(p, dtype=np.float64), self.temperature, np.asarray(self.bias))

    def to_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "bias": list(self.bias),
                "objective": self.objective, "n_fit": self.n_fit}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Calibrator:
        """The calibrator a dict describes; None or {} is the identity."""
        if not d:
            return cls()
        return cls(temperature=float(d.get("temperature", 1.0)),
                   bias=tuple(float(b) for b in d.get("bias", (0.0,) * NUM_BINS)),
                   objective=str(d.get("objective", "nll")), n_fit=int(d.get("n_fit", 0)))


def calibrated(p: np.ndarray, temperature: float, bias: np.ndarray) -> np.ndarray:
    """softmax(log(max(p, EPS)) / temperature + bias), row-wise; p of shape (n, 8)."""
    logits = np.log(np.clip(p, EPS, 1.0)) / temperature + bias[None, :]
    logits -= logits.max(axis=1, keepdims=True)
    q = np.exp(logits)
    return q / q.sum(axis=1, keepdims=True)


def _loss(q: np.ndarray, y: np.ndarray, objective: str) -> float:
    """Mean NLL or halved Brier of q (n, 8) against bins y (1..8)."""
    rows = np.arange(len(y))
    if objective == "nll":
        return float(-np.log(np.clip(q[rows, y - 1], 1e-12, 1.0)).mean())
    onehot = np.zeros_like(q)
    onehot[rows, y - 1] = 1.0
    return float(0.5 * ((q - onehot) ** 2).sum(axis=1).mean())


def fit_calibrator(
    p: np.ndarray | Sequence[Sequence[float]],
    true_bin: np.ndarray | Sequence[int],
    objective: Objective = "nll",
    biases: bool = True,
) -> Calibrator:
    """Fit T (and per-bin biases) minimising `objective` on calibration forecasts.

    Args:
        p: the uncalibrated forecasts of the calibration pairs, (n, 8).
        true_bin: their true bins, 1..8.
        objective: "nll" or "brier" (halved, method.md section 3).
        biases: also fit the eight biases (vector scaling); False fits T alone.
    Returns:
        The fitted Calibrator; the identity when there are no calibration pairs.
    Raises:
        ValueError: shapes disagree or a bin is outside 1..8.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(1, 9, 400)
    >>> sharp = np.full((400, 8), 0.01); sharp[np.arange(400), y - 1] = 0.93
    >>> noisy = np.where(rng.random(400) < 0.5, y, rng.integers(1, 9, 400))
    >>> fit_calibrator(sharp, noisy, biases=False).temperature > 1  # overconfident: flatten
    True
    """
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(true_bin, dtype=np.int64)
    if p.ndim != 2 or p.shape[1] != NUM_BINS or len(y) != len(p):
        raise ValueError(f"need p of shape (n, {NUM_BINS}) and n bins, got {p.shape} and {len(y)}")
    if len(y) == 0:
        return Calibrator(objective=objective)
    if y.min() < 1 or y.max() > NUM_BINS:
        raise ValueError("true bins must lie in 1..8")

    def unpack(x: np.ndarray) -> tuple[float, np.ndarray]:
        # log T keeps T positive; the first bias is pinned to 0 (softmax is shift-invariant)
        bias = np.concatenate([[0.0], x[1:]]) if biases else np.zeros(NUM_BINS)
        return float(np.exp(x[0])), bias

    def objective_fn(x: np.ndarray) -> float:
        t, b = unpack(x)
        return _loss(calibrated(p, t, b), y, objective) + BIAS_L2 * float((b**2).sum())

    from scipy.optimize import minimize  # here: applying a calibrator needs numpy alone

    x0 = np.zeros(NUM_BINS if biases else 1)
    res = minimize(objective_fn, x0, method="L-BFGS-B", bounds=[(-4.0, 4.0)] + [(-6.0, 6.0)] * (len(x0) - 1))
    t, b = unpack(res.x)
    fitted = Calibrator(temperature=t, bias=tuple(float(v) for v in b), objective=objective, n_fit=len(y))
    # Never worse than the identity on the data it was fitted on (a failed optimisation).
    if _loss(fitted.apply(p), y, objective) > _loss(p / p.sum(axis=1, keepdims=True), y, objective):
        return Calibrator(objective=objective, n_fit=len(y))
    return fitted
