"""Every number of method.md sections 3 and 4 from one forecasts frame.

This is what `kernelcast evaluate --forecasts F.parquet [--json]` prints and what the
evaluation assets log. Input columns:

    required  pair_id, task, true_speedup (S > 0, the candidate over its anchor; a column
              named speedup is accepted instead, as the warehouse's pairs join gives), p1..p8
    optional  predicted_bin (default argmax p, first max), repeat (default 0),
              parse_ok (default true; false = parse failure, its p and bin are ignored),
              candidate_kernel_id | kernel_id | candidate (ranking ties; default pair_id),
              anchor_kernel_id | anchor, hardware_id (pool keys), pair_type ('parent' rows
              go to the discovery metrics; every other row to the main set)

Conventions (repeated in the output under "conventions"):
- the true bin comes from true_speedup through models.bins (the pinned table);
- parsed probabilities must lie in [0, 1] and sum to 1 within `sum_tolerance`; they are
  renormalised exactly before scoring;
- full-set means score a parse failure as the uniform distribution; accuracy and
  off-by-one count it as wrong; ECE and parsed-only means leave failures out;
- each metric is computed per repeat, then averaged over repeats; "spread" is the sample
  std over repeats; "intervals" are stratified pair-bootstrap percentile intervals;
- uneven repeats (pairs forecast a different number of times) weigh every pair the same: a
  pair's forecasts are cycled over R = lcm of the pairs' repeat counts (at most
  MAX_VIRTUAL_REPEATS) virtual repeats, so each virtual repeat holds every pair once and each of
  a pair's forecasts is used equally often (an average of a pair's scores, then over pairs);
- numeric columns must be numbers: text in true_speedup, p1..p8, predicted_bin, repeat or
  parse_ok is refused, never parsed.

Top-level JSON keys: n, n_pairs, n_repeats, n_tasks, parse_rate, brier, crps, nll, entropy,
accuracy, off_by_one, ece, aurc, selective_risk_at_50, aurc_certainty, aurc_margin,
selective_risk_at_50_certainty, selective_risk_at_50_margin, recovered_mean,
recovered_at_10, within_20, recovered_random_mean, recovered_random_at_10,
recovered_oracle_mean, parsed_only, per_task, intervals, interval_level, n_boot, seed,
spread, discovery, curves, conventions. NaN is written as null.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS, speedups_to_bins
from pipelines.evaluation import bootstrap, calibration, discovery, scores, selective, utility
from warehouse.bin_edges import P_COLS

log = logging.getLogger(__name__)

REQUIRED = ("pair_id", "task", "true_speedup", *P_COLS)
TIEBREAK_COLS = ("candidate_kernel_id", "kernel_id", "candidate")
ANCHOR_COLS = ("anchor_kernel_id", "anchor")
SUM_TOLERANCE = 1e-3

SCORE_KEYS = scores.SCORE_KEYS
INTERVAL_KEYS = (
    "parse_rate", "brier", "crps", "nll", "accuracy", "off_by_one", "ece", "aurc",
    "selective_risk_at_50", "recovered_mean", "recovered_at_10", "within_20",
    "recovered_random_mean",
)
CONVENTIONS = (
    "true bin from true_speedup via the pinned right-closed table (models.bins)",
    (
        "full-set means score a parse failure as the uniform distribution; accuracy and "
        "off-by-one count it as wrong; ECE and parsed_only leave failures out"
    ),
    "ECE: confidence = p[predicted_bin], 10 equal-width buckets, parsed forecasts only",
    (
        "risk = 1 - accuracy of the covered set; coverage over all forecasts (failures "
        "abstain); AURC = trapezoid area with the first risk held back to coverage 0, divided "
        "by the largest coverage reached; selective risk at 50% = risk at the first threshold "
        "whose coverage reaches 0.5 (null if never reached)"
    ),
    (
        "utility: rank by expected log2-speedup, failures last, ties by kernel id ascending; "
        "k = max(1, ceil(f n)); a task's curve is the mean of its pools (task, hardware, anchor)"
    ),
    "discovery: probability = p bins 5..8, predicted when > 0.5",
    (
        "metrics per repeat, then mean over repeats; spread = sample std over repeats; "
        "intervals = percentile bootstrap over pairs, stratified by task"
    ),
    (
        "uneven repeats: every pair weighs the same; its forecasts are cycled over lcm(repeat counts) "
        "virtual repeats, each holding every pair once"
    ),
)
MAX_VIRTUAL_REPEATS = 60  # lcm of the repeat counts; e.g. counts 1..5 need 60
NUMERIC_COLUMNS = ("true_speedup", "speedup", *P_COLS, "predicted_bin", "repeat")


@dataclass(frozen=True)
class ForecastArrays:
    """Validated forecasts as aligned numpy arrays (one entry per forecast row)."""

    pair: np.ndarray  # (n,) int pair code
    task: np.ndarray  # (n,) str
    pool: np.ndarray  # (n,) int pool code (task, hardware, anchor)
    tiebreak: np.ndarray  # (n,) int rank of the kernel id, ascending
    repeat: np.ndarray  # (n,) int
    speedup: np.ndarray  # (n,) true S
    y: np.ndarray  # (n,) true bin 1..8
    p: np.ndarray  # (n, 8) renormalised; uniform on failed rows
    predicted_bin: np.ndarray  # (n,) stated bin; 0 on failed rows
    parse_ok: np.ndarray  # (n,) bool

    def take(self, idx: np.ndarray) -> ForecastArrays:
        """The rows at `idx` (duplicates allowed, for the bootstrap)."""
        return replace(self, **{f: getattr(self, f)[idx] for f in self.__dataclass_fields__})

    def __len__(self) -> int:
        return int(self.pair.size)


def _codes(values: list) -> np.ndarray:
    """Dense integer codes in sorted order of the distinct values."""
    return np.unique(np.asarray(values, dtype=object).astype(str), return_inverse=True)[1].astype(np.int64)


def prepare(frame: pl.DataFrame, *, sum_tolerance: float = SUM_TOLERANCE) -> ForecastArrays:
    """Validate a forecasts frame and turn it into arrays.

    Args:
        frame: forecasts (see the module docstring for columns).
        sum_tolerance: allowed |sum p - 1| of a parsed row.
    Returns:
        `ForecastArrays`.
    Raises:
        ValueError: one line, on missing columns, nulls, bad probabilities, bad bins, bad
            speedups or a duplicated (pair_id, repeat).
    """
    for col in NUMERIC_COLUMNS:
        if col in frame.columns and not (frame[col].dtype.is_numeric() or frame[col].dtype == pl.Null):
            raise ValueError(f"forecasts column {col} is {frame[col].dtype}, not numeric: write numbers, not text")
    if "parse_ok" in frame.columns and frame["parse_ok"].dtype not in (pl.Boolean, pl.Null) \
            and not frame["parse_ok"].dtype.is_integer():
        raise ValueError(f"forecasts column parse_ok is {frame['parse_ok'].dtype}, not boolean")
    if "true_speedup" not in frame.columns and "speedup" in frame.columns:
        frame = frame.rename({"speedup": "true_speedup"})  # the warehouse's forecasts+pairs join
    for col in ("model_ref", "model"):
        if col in frame.columns and frame[col].n_unique() > 1:
            raise ValueError(f"forecasts hold {frame[col].n_unique()} models ({col}); evaluate one at a time")
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"forecasts are missing column(s): {', '.join(missing)}")
    n = frame.height
    if n == 0:
        raise ValueError("forecasts frame is empty")
    parse_ok = (
        frame["parse_ok"].fill_null(False).cast(pl.Boolean).to_numpy()
        if "parse_ok" in frame.columns
        else np.ones(n, dtype=bool)
    )
    for c in ("pair_id", "task", "true_speedup"):
        if frame[c].null_count():
            raise ValueError(f"forecasts column {c} has {frame[c].null_count()} null value(s)")
    try:
        speedup = frame["true_speedup"].cast(pl.Float64).to_numpy()
    except Exception as exc:  # noqa: BLE001 - any cast failure is bad input
        raise ValueError(f"forecasts column true_speedup is not numeric: {exc}") from None
    if not np.all(np.isfinite(speedup) & (speedup > 0)):
        raise ValueError("true_speedup must be finite and > 0 on every row")
    y = speedups_to_bins(speedup)

    p = np.column_stack([frame[c].cast(pl.Float64).fill_null(np.nan).to_numpy() for c in P_COLS])
    pp = p[parse_ok]
    if pp.size:
        bad = ~np.all(np.isfinite(pp) & (pp >= 0) & (pp <= 1), axis=1)
        if bad.any():
            raise ValueError(
                f"bad probabilities: {int(bad.sum())} parsed row(s) have p outside [0, 1], NaN or null"
            )
        sums = pp.sum(axis=1)
        off = np.abs(sums - 1.0) > sum_tolerance
        if off.any():
            raise ValueError(
                f"bad probabilities: {int(off.sum())} parsed row(s) do not sum to 1 "
                f"(e.g. {float(sums[off][0]):.6g}; tolerance {sum_tolerance})"
            )
    p = scores.effective_probabilities(p, parse_ok)
    p[parse_ok] = p[parse_ok] / p[parse_ok].sum(axis=1, keepdims=True)

    argmax = np.argmax(p, axis=1) + 1
    if "predicted_bin" in frame.columns:
        stated = frame["predicted_bin"].cast(pl.Float64).to_numpy()
        stated = np.where(np.isnan(stated), argmax, stated)
        bad_bin = parse_ok & ~np.isin(stated, np.arange(1, NUM_BINS + 1))
        if bad_bin.any():
            raise ValueError(f"predicted_bin must be an integer 1..8 on parsed rows ({int(bad_bin.sum())} bad)")
        predicted = stated.astype(np.int64)
    else:
        predicted = argmax
    predicted = np.where(parse_ok, predicted, 0)

    repeat = (
        frame["repeat"].fill_null(0).cast(pl.Int64).to_numpy()
        if "repeat" in frame.columns
        else np.zeros(n, dtype=np.int64)
    )
    pair_ids = frame["pair_id"].cast(pl.Utf8).to_list()
    if len(set(zip(pair_ids, repeat.tolist()))) != n:
        raise ValueError("forecasts hold a duplicated (pair_id, repeat)")
    tie_col = next((c for c in TIEBREAK_COLS if c in frame.columns), "pair_id")
    anchor_col = next((c for c in ANCHOR_COLS if c in frame.columns), None)
    task = np.asarray(frame["task"].cast(pl.Utf8).to_list(), dtype=object)
    hw = frame["hardware_id"].cast(pl.Utf8).fill_null("").to_list() if "hardware_id" in frame.columns else [""] * n
    anchor = frame[anchor_col].cast(pl.Utf8).fill_null("").to_list() if anchor_col else [""] * n
    pool_keys = [f"{t}\x1f{h}\x1f{a}" for t, h, a in zip(task.tolist(), hw, anchor)]
    tiebreak = frame[tie_col].cast(pl.Utf8).fill_null("").to_list()
    return ForecastArrays(
        pair=_codes(pair_ids),
        task=task.astype(str),
        pool=_codes(pool_keys),
        tiebreak=_codes(tiebreak),
        repeat=repeat,
        speedup=speedup,
        y=y,
        p=p,
        predicted_bin=predicted,
        parse_ok=parse_ok,
    )


def balance_repeats(a: ForecastArrays) -> ForecastArrays:
    """The forecasts with repeats numbered 0.. within each pair and, when pairs have different
    numbers of repeats, cycled to lcm(counts) virtual repeats (module docstring).

    Raises:
        ValueError: the lcm of the repeat counts is above MAX_VIRTUAL_REPEATS.
    """
    order = np.lexsort((a.repeat, a.pair))
    sorted_pairs = a.pair[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_pairs)) + 1]
    counts = np.diff(np.r_[starts, order.size])
    if np.all(counts == counts[0]):
        ordinal = np.empty_like(a.repeat)
        ordinal[order] = np.arange(order.size) - np.repeat(starts, counts)
        return replace(a, repeat=ordinal)
    n_virtual = int(np.lcm.reduce(counts))
    if n_virtual > MAX_VIRTUAL_REPEATS:
        raise ValueError(
            f"uneven repeats ({int(counts.min())} to {int(counts.max())} per pair) need {n_virtual} virtual repeats "
            f"to weigh every pair the same (at most {MAX_VIRTUAL_REPEATS}); give every pair the same number of repeats"
        )
    r = np.tile(np.arange(n_virtual), starts.size)
    idx = order[np.repeat(starts, n_virtual) + r % np.repeat(counts, n_virtual)]
    return replace(a.take(idx), repeat=r.astype(a.repeat.dtype))


# ----------------------------------------------------------------------------- metrics


def _one_repeat(a: ForecastArrays, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """Flat metrics of the rows of one repeat: all of them, or at least `keys`.

    A bootstrap replicate needs only INTERVAL_KEYS: the parsed-only means, the entropy and the
    risk-coverage curves of the other two confidence scores are left out of it (about a
    quarter of a replicate's time); what is computed is computed the same way.
    """
    every = keys is None
    selected = (lambda name: True) if every else set(keys).__contains__
    means = scores.score_means(a.p, a.y, a.predicted_bin, a.parse_ok,
                               tuple(k for k in scores.SCORE_KEYS if selected(k)), parsed=every)
    out: dict[str, float] = {"parse_rate": means["parse_rate"], **means["full"]}
    out.update({f"parsed_{k}": v for k, v in means["parsed"].items()})
    if selected("ece"):
        out["ece"] = calibration.expected_calibration_error(a.p, a.predicted_bin, a.y, a.parse_ok).ece
    suffixes = {name: "" if name == "max_prob" else f"_{name}" for name in selective.CONFIDENCE_SCORES}
    names = tuple(n for n, sfx in suffixes.items() if selected(f"aurc{sfx}") or selected(f"selective_risk_at_50{sfx}"))
    if names:
        correct = scores.accuracy(a.predicted_bin, a.y, a.parse_ok).astype(bool)
        for name, s in selective.confidence_scores(a.p, names).items():
            rc = selective.risk_coverage(s, correct, a.parse_ok)
            out[f"aurc{suffixes[name]}"] = rc.aurc
            out[f"selective_risk_at_50{suffixes[name]}"] = rc.risk_at(0.5)
    u = utility.utility(
        a.task, a.pool, a.speedup, utility.expected_log2_score(a.p), a.parse_ok, a.tiebreak
    )
    out.update(u.summary())
    return out


def _per_repeat(a: ForecastArrays, keys: tuple[str, ...] | None = None) -> list[dict[str, float]]:
    """Flat metrics of each repeat on its own (all, or at least `keys`)."""
    repeats = np.unique(a.repeat)
    if repeats.size == 1:  # the common case: no copy
        return [_one_repeat(a, keys)]
    return [_one_repeat(a.take(np.nonzero(a.repeat == r)[0]), keys) for r in repeats]


def headline(a: ForecastArrays, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """Flat metrics averaged over repeats (each repeat scored on its own): all of them, or at
    least `keys` (a bootstrap replicate's)."""
    per = _per_repeat(a, keys)
    if len(per) == 1:  # the common case, once per bootstrap replicate: the mean of one value is itself
        return {k: float(v) if math.isfinite(v) else math.nan for k, v in per[0].items()}
    keys = per[0].keys()
    return {k: _nanmean([m[k] for m in per]) for k in keys}


def _nanmean(values: list[float]) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def _discovery(a: ForecastArrays) -> dict[str, Any]:
    """Discovery metrics (averaged over repeats), overall and per task."""

    def one(sub: ForecastArrays) -> dict[str, float]:
        per = []
        for r in np.unique(sub.repeat):
            s = sub.take(np.nonzero(sub.repeat == r)[0])
            per.append(discovery.discovery_metrics(discovery.discovery_probability(s.p), s.speedup > 1.0))
        out = {k: _nanmean([m[k] for m in per]) for k in per[0]}
        out["n"] = len(sub)
        return out

    out: dict[str, Any] = one(a)
    out["per_task"] = {t: one(a.take(np.nonzero(a.task == t)[0])) for t in sorted(set(a.task.tolist()))}
    return out


def _curves(a: ForecastArrays) -> dict[str, Any]:
    """Figure data: reliability and risk-coverage over all rows (repeats pooled);
    recovered-vs-budget curves averaged over repeats."""
    rel = calibration.expected_calibration_error(a.p, a.predicted_bin, a.y, a.parse_ok)
    correct = scores.accuracy(a.predicted_bin, a.y, a.parse_ok).astype(bool)
    rc = {
        name: selective.risk_coverage(s, correct, a.parse_ok).to_dict()
        for name, s in selective.confidence_scores(a.p).items()
    }
    model: dict[str, list[np.ndarray]] = {}
    rand: dict[str, list[np.ndarray]] = {}
    for r in np.unique(a.repeat):
        s = a.take(np.nonzero(a.repeat == r)[0])
        u = utility.utility(s.task, s.pool, s.speedup, utility.expected_log2_score(s.p), s.parse_ok, s.tiebreak)
        for t in u.model:
            model.setdefault(t, []).append(u.model[t])
            rand.setdefault(t, []).append(u.random[t])
    model_t = {t: np.mean(v, axis=0) for t, v in sorted(model.items())}
    rand_t = {t: np.mean(v, axis=0) for t, v in sorted(rand.items())}
    return {
        "reliability": rel.to_dict(),
        "risk_coverage": rc,
        "recovered": {
            "percents": utility.BUDGET_PERCENTS.tolist(),
            "model": {t: v.tolist() for t, v in model_t.items()},
            "random": {t: v.tolist() for t, v in rand_t.items()},
            "model_mean": np.mean(list(model_t.values()), axis=0).tolist(),
            "random_mean": np.mean(list(rand_t.values()), axis=0).tolist(),
        },
    }


def _reshape(flat: dict[str, float]) -> dict[str, Any]:
    """Move parsed_* keys under "parsed_only"."""
    out: dict[str, Any] = {k: v for k, v in flat.items() if not k.startswith("parsed_")}
    out["parsed_only"] = {k[len("parsed_"):]: v for k, v in flat.items() if k.startswith("parsed_")}
    return out


def _clean(x: Any) -> Any:
    """NaN/inf -> None and numpy scalars -> Python, recursively, so json.dumps works."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _counts(a: ForecastArrays) -> dict[str, int]:
    return {
        "n": len(a),
        "n_pairs": int(np.unique(a.pair).size),
        "n_repeats": int(np.unique(a.repeat).size),
        "n_tasks": int(np.unique(a.task).size),
    }


PER_TASK_BOOT = 200


def evaluate_forecasts(
    frame: pl.DataFrame,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    sum_tolerance: float = SUM_TOLERANCE,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """All metrics of one forecaster's forecasts, as a JSON-ready dict.

    Args:
        frame: forecasts (module docstring); 'parent' rows (pair_type) feed "discovery".
        n_boot: bootstrap replicates for "intervals" (0 skips them).
        seed: bootstrap seed.
        level: interval coverage.
        sum_tolerance: allowed |sum p - 1| of a parsed row.
        progress: called as progress(done, total) during the bootstrap (for a CLI bar).
    Returns:
        The dict described in the module docstring.
    Raises:
        ValueError: one line, on bad input.
    """
    disc_frame = None
    if "pair_type" in frame.columns:
        is_parent = frame["pair_type"].cast(pl.Utf8).fill_null("") == "parent"
        disc_frame = frame.filter(is_parent)
        frame = frame.filter(~is_parent)
        if frame.height == 0:
            raise ValueError("forecasts hold only 'parent' pairs; the main metrics need eval-set pairs")
    given = prepare(frame, sum_tolerance=sum_tolerance)
    a = balance_repeats(given)

    per_repeat = _per_repeat(a)
    flat = {k: _nanmean([m[k] for m in per_repeat]) for k in per_repeat[0]}
    result: dict[str, Any] = {**_counts(given), **_reshape(flat)}

    result["per_task"] = {}
    for t in sorted(set(a.task.tolist())):
        sub = a.take(np.nonzero(a.task == t)[0])
        counts = _counts(given.take(np.nonzero(given.task == t)[0]))
        result["per_task"][t] = {**counts, **_reshape(headline(sub))}

    log.info("bootstrapping %d replicates over %d pairs", n_boot, result["n_pairs"])
    result["intervals"] = bootstrap.bootstrap_intervals(
        lambda rows: headline(a.take(rows), INTERVAL_KEYS),
        a.pair,
        _codes(a.task.tolist()),
        INTERVAL_KEYS,
        n_boot=n_boot,
        seed=seed,
        level=level,
        progress=progress,
    )
    # Per-task intervals: the same bootstrap within each task's pairs, with at most
    # PER_TASK_BOOT replicates (tasks have tens of pairs; 200 replicates pin a 95% percentile
    # interval to about a percentile point, and keep a rerun of the graph fast).
    for t in result["per_task"]:
        sub = a.take(np.nonzero(a.task == t)[0])
        result["per_task"][t]["intervals"] = bootstrap.bootstrap_intervals(
            lambda rows, sub=sub: headline(sub.take(rows), INTERVAL_KEYS),
            sub.pair,
            np.zeros(len(sub.pair), dtype=np.int64),
            INTERVAL_KEYS,
            n_boot=min(n_boot, PER_TASK_BOOT),
            seed=seed,
            level=level,
        )
    result["interval_level"] = level
    result["n_boot"] = n_boot
    result["seed"] = seed
    result["spread"] = bootstrap.repeat_spread(per_repeat, INTERVAL_KEYS)
    result["discovery"] = (
        _discovery(balance_repeats(prepare(disc_frame, sum_tolerance=sum_tolerance)))
        if disc_frame is not None and disc_frame.height
        else None
    )
    result["curves"] = _curves(a)
    result["conventions"] = list(CONVENTIONS)
    return _clean(result)


def evaluate_file(path: str | Path, **kwargs: Any) -> dict[str, Any]:
    """`evaluate_forecasts` of a Parquet file (keyword arguments pass through).

    Raises:
        ValueError: one line, if the file is missing or not readable Parquet, or on bad input.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"forecasts file not found: {path}")
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - reported as one line
        raise ValueError(f"cannot read forecasts Parquet {path}: {str(exc).splitlines()[0]}") from None
    return evaluate_forecasts(frame, **kwargs)
