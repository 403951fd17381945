"""How far forecasters fitted on the reference card carry to another card (docs/method.md).

For each target card T of a dataset version (every hardware but the reference card R,
pipelines.curation.hardware):

- eval: T's reference pairs (a kernel against its task's reference, measured on T), chosen as
  the in-distribution eval set is (up to `per_bin` per task and bin, seeded hash of the kernel
  id), among candidates of any generator that R's forecasters never learned from: no kernel of
  R's fit or calibration pairs is a T eval candidate. Most of T's kernels are rewrites of R's
  template kernels, so T's eval is not R's eval set moved to another card: it is scored beside
  R's in-distribution and external Brier, not in place of either;
- pool: T's other reference pairs, less the `lineage_k` neighbourhood of the eval candidates, in
  a bin-balanced order (round robin over the (task, bin) cells, a cell's pairs by seeded hash):
  its first n pairs are what a user who measured n kernels on T holds, spread over the bins as
  the calibration split of the in-distribution setting is.

The settings, each on T's eval pairs:
- zero_shot (a): R's registered versions as they are. T's fingerprint reaches a forecaster that
  reads the hardware table (the language models' prompt); the classical forecasters read the
  sm_90 compile and the source, which are the same on both cards;
- calibrated@n (b): R's version with a calibrator (temperature and per-bin biases, NLL,
  models.calibration) fitted on its forecasts of the first n pool pairs;
- fitted@n (c): the classical kinds fitted on the first n pool pairs (every fifth pair held
  for their own calibration, with its lineage neighbourhood out of the fit part); at n = all,
  the versions registered for T (tag `hardware`, models.registry.hardware);
- the curve: Brier of (b) and (c) against n = 0 (zero shot), the configured sizes, and all.

Beside them, the bin agreement of the kernels correct on both cards (each against its task's
reference on that card): how often the two cards put a kernel in the same bin. A forecaster that
knew R's true bins exactly would still miss T's on every kernel where the cards disagree.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS, speedups_to_bins
from pipelines.curation.splits import (
    DEFAULT_LINEAGE_K,
    lineage_map,
    lineage_neighbourhood,
    select_eval_candidates,
)
from pipelines.surrogates.roles import Roles

log = logging.getLogger(__name__)

ZERO_SHOT = "zero_shot"
CALIBRATED = "calibrated"
FITTED = "fitted"
CALIBRATION_EVERY = 5  # of the first n pool pairs, every fifth calibrates a fitted@n forecaster
DEFAULT_SIZES = (100, 300, 1000)


def setting_name(setting: str, n: int | None) -> str:
    """`calibrated@300`, `fitted@all`.

    >>> setting_name("fitted", None), setting_name("calibrated", 100)
    ('fitted@all', 'calibrated@100')
    """
    return f"{setting}@{'all' if n is None else n}"


def _hash(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}|{key}".encode()).hexdigest()


def balanced_order(pairs: pl.DataFrame, seed: int = 0) -> pl.DataFrame:
    """Pairs in rounds over their (task, bin) cells: the first round holds one pair of every
    cell, the next one more of every cell that has it; a cell's pairs and a round's cells in
    seeded-hash order, so any prefix is as bin-balanced per task as the pairs allow.

    >>> f = pl.DataFrame({"task": ["t"] * 4, "true_bin": [1, 1, 1, 2], "candidate_kernel_id": list("abcd")})
    >>> balanced_order(f)["true_bin"].to_list()[:2] in ([1, 2], [2, 1])
    True
    """
    if pairs.is_empty():
        return pairs
    keyed = pairs.with_columns(pl.Series("_h", [_hash(seed, k) for k in pairs["candidate_kernel_id"]], dtype=pl.Utf8))
    keyed = keyed.sort(["task", "true_bin", "_h"]).with_columns(
        pl.int_range(pl.len()).over(["task", "true_bin"]).alias("_round"))
    return keyed.sort(["_round", "_h"]).drop("_h", "_round")


@dataclass(frozen=True)
class CardRoles:
    """The pairs of one target card's settings.

    Attributes:
        hardware_id: the target card T.
        reference_hardware: the card R its zero-shot forecasters were fitted on.
        eval: T's eval pairs (reference pairs, bin-balanced per task).
        pool: T's other reference pairs, bin-balanced order (`balanced_order`).
        lineage: kernel_id, parent_kernel_id of T's kernels (the fitted settings' calibration cut).
        learned_left_out: T candidates not eligible for eval because R's forecasters learned
            from them.
        lineage_k: mutations around a candidate kept apart (eval vs pool, calibration vs fit).
    """

    hardware_id: str
    reference_hardware: str
    eval: pl.DataFrame
    pool: pl.DataFrame
    lineage: pl.DataFrame
    learned_left_out: int = 0
    lineage_k: int = DEFAULT_LINEAGE_K

    def first(self, n: int | None) -> pl.DataFrame:
        """The first n pool pairs (None: all of them)."""
        return self.pool if n is None else self.pool.head(n)

    def fit_and_calibration(self, n: int | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(fit, calibration) of a forecaster fitted on the first n pool pairs: every fifth pair
        calibrates; the fit part loses the pairs within `lineage_k` of a calibration candidate."""
        first = self.first(n)
        if first.is_empty():
            return first, first
        index = pl.int_range(pl.len())
        calibration = first.filter(index % CALIBRATION_EVERY == CALIBRATION_EVERY - 1)
        refs = set(first["anchor_kernel_id"].to_list())
        blocked = lineage_neighbourhood(calibration["candidate_kernel_id"].to_list(),
                                        lineage_map(self.lineage, refs), self.lineage_k) - refs
        fit = first.filter((index % CALIBRATION_EVERY != CALIBRATION_EVERY - 1)
                           & ~pl.col("candidate_kernel_id").is_in(list(blocked)))
        return fit, calibration

    def sizes(self, configured: Iterable[int]) -> list[int | None]:
        """The curve's fitted sizes: each configured size below the pool's, then None (all)."""
        return sorted({n for n in configured if 0 < n < self.pool.height}) + ([None] if self.pool.height else [])

    def roles(self, sizes: Sequence[int | None] = (None,)) -> Roles:
        """`Roles` whose in-distribution setting is fitted@all and whose settings `fitted@<n>` are
        the other sizes (fit, calibration, eval): what `fit_many` and `train_and_register` take."""
        fit, calibration = self.fit_and_calibration(None)
        empty = self.eval.head(0)
        settings = {setting_name(FITTED, n): (*self.fit_and_calibration(n), self.eval) for n in sizes if n is not None}
        return Roles(fit, calibration, self.eval, empty, empty, empty, None, None, settings, self.hardware_id)


def card_roles(card_pairs: pl.DataFrame, lineage: pl.DataFrame, reference_hardware: str, learned: set[str],
               per_bin: int = 12, lineage_k: int = DEFAULT_LINEAGE_K, seed: int = 0) -> CardRoles:
    """The settings' pairs of the target card whose pairs `card_pairs` are.

    Args:
        card_pairs: the dataset version's pairs of one card (any split; its reference pairs are used).
        lineage: kernel_id, parent_kernel_id of that card's kernels.
        reference_hardware: the reference card R.
        learned: kernel ids R's forecasters learned from (their fit and calibration pairs').
        per_bin: eval candidates per (task, bin), as the in-distribution eval set.
        lineage_k: mutations around an eval candidate kept out of the pool.
        seed: the eval choice's and the pool order's seed.
    Raises:
        ValueError: `card_pairs` hold no card or several (one line).
    """
    cards = set(card_pairs["hardware_id"].to_list())
    if len(cards) != 1:
        raise ValueError(f"the pairs of one card are needed, got {len(cards)} cards")
    card = cards.pop()
    reference = card_pairs.filter(pl.col("pair_type") == "reference").unique("pair_id", keep="first").sort("pair_id")
    refs = set(reference["anchor_kernel_id"].to_list())
    eligible = reference.filter(~pl.col("candidate_kernel_id").is_in(list(learned - refs)))
    chosen, _ = select_eval_candidates(eligible, per_bin, seed)
    blocked = lineage_neighbourhood(chosen["candidate_kernel_id"].to_list(), lineage_map(lineage, refs), lineage_k) - refs
    pool = reference.filter(~pl.col("pair_id").is_in(chosen["pair_id"].to_list())
                            & ~pl.col("candidate_kernel_id").is_in(list(blocked)))
    log.info("%s: %d eval pairs, %d pool pairs, %d candidates learned on %s left out of eval", card, chosen.height,
             pool.height, reference.height - eligible.height, reference_hardware)
    return CardRoles(card, reference_hardware, chosen.sort("pair_id"), balanced_order(pool, seed),
                     lineage.select("kernel_id", "parent_kernel_id"), reference.height - eligible.height, lineage_k)


def learned_kernels(roles: Roles) -> set[str]:
    """Kernel ids a reference forecaster learned from: its fit and calibration pairs' kernels."""
    out: set[str] = set()
    for frame in (roles.fit, roles.calibration):
        if frame.height:
            out |= set(frame["anchor_kernel_id"].to_list()) | set(frame["candidate_kernel_id"].to_list())
    return out


# ---------------------------------------------------------------------------- scores

def _one_hot(y: np.ndarray) -> np.ndarray:
    return np.eye(NUM_BINS)[np.asarray(y, dtype=np.int64) - 1]


def brier_rows(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Halved Brier per row (method.md section 3)."""
    return 0.5 * ((np.asarray(p, dtype=np.float64) - _one_hot(y)) ** 2).sum(axis=1)


def scores(p: np.ndarray, pairs: pl.DataFrame, n_boot: int = 0, seed: int = 0) -> dict[str, Any]:
    """n, Brier (and its 95% bootstrap interval over pairs, stratified by task), CRPS, NLL,
    accuracy, off-by-one and ECE of forecasts `p` (n, 8) of `pairs` (true_bin, task)."""
    from pipelines.evaluation import scores as sc
    from pipelines.evaluation.bootstrap import bootstrap_intervals
    from pipelines.evaluation.calibration import expected_calibration_error

    y = pairs["true_bin"].to_numpy().astype(np.int64)
    p = np.asarray(p, dtype=np.float64)
    if not len(y):
        return {"n": 0}
    b = brier_rows(p, y)
    pred = p.argmax(axis=1) + 1
    ok = np.ones(len(y), dtype=bool)
    out = {"n": int(len(y)), "brier": float(b.mean()), "crps": float(sc.crps(p, y).mean()),
           "nll": float(sc.nll(p, y).mean()), "accuracy": float(sc.accuracy(pred, y, ok).mean()),
           "off_by_one": float(sc.off_by_one(pred, y, ok).mean()),
           "ece": float(expected_calibration_error(p, pred, y, ok).ece)}
    if n_boot > 0:
        strata = pairs["task"].cast(pl.Categorical).to_physical().to_numpy()
        out["brier_ci"] = bootstrap_intervals(lambda r: {"brier": float(b[r].mean())}, np.arange(len(y)), strata,
                                              ["brier"], n_boot=n_boot, seed=seed)["brier"]
    return out


def uniform(n: int) -> np.ndarray:
    return np.full((n, NUM_BINS), 1.0 / NUM_BINS)


def bin_prior(pairs: pl.DataFrame, fit: pl.DataFrame) -> np.ndarray:
    """The per-task bin prior of `fit` for each of `pairs` (models.baselines)."""
    from models.baselines import bin_prior_forecasts

    frame = bin_prior_forecasts(pairs, fit)
    return frame.select([f"p{i}" for i in range(1, NUM_BINS + 1)]).to_numpy()


# ---------------------------------------------------------------------------- agreement

def bin_agreement(labels: pl.DataFrame, reference_hardware: str, hardware_id: str) -> dict[str, Any]:
    """Bins of the kernels correct on both cards, side by side, per task and over all.

    Args:
        labels: `pipelines.curation.pairs.labels` of both cards (task, hardware_id, kernel_id,
            generator, correct, speedup).
        reference_hardware, hardware_id: the two cards.
    Returns:
        {"rows": [one per task, then "all": n, same (share in the same bin), within_one,
        mean_shift (bins on the target minus the reference), median_ratio (speedup on the
        target over the reference)], "n": kernels}; the task references are left out.
    """
    ok = labels.filter(pl.col("correct") & pl.col("speedup").is_not_null()
                       & (pl.col("generator").fill_null("") != "reference"))
    a = ok.filter(pl.col("hardware_id") == reference_hardware).select("task", "kernel_id", pl.col("speedup").alias("s_ref"))
    b = ok.filter(pl.col("hardware_id") == hardware_id).select("task", "kernel_id", pl.col("speedup").alias("s_card"))
    both = a.join(b, on=["task", "kernel_id"], how="inner")
    if both.is_empty():
        return {"rows": [], "n": 0}
    both = both.with_columns(
        pl.Series("bin_ref", speedups_to_bins(both["s_ref"].to_numpy()), dtype=pl.Int64),
        pl.Series("bin_card", speedups_to_bins(both["s_card"].to_numpy()), dtype=pl.Int64))

    def row(task: str, f: pl.DataFrame) -> dict[str, Any]:
        d = (f["bin_card"] - f["bin_ref"]).to_numpy()
        return {"task": task, "n": f.height, "same": float(np.mean(d == 0)), "within_one": float(np.mean(np.abs(d) <= 1)),
                "mean_shift": float(np.mean(d)), "median_ratio": float(np.median(f["s_card"] / f["s_ref"]))}

    rows = [row(t, both.filter(pl.col("task") == t)) for t in sorted(set(both["task"].to_list()))]
    return {"rows": [*rows, row("all", both)], "n": both.height}


# ---------------------------------------------------------------------------- the study

@dataclass
class CardStudy:
    """What the settings of one target card gave.

    Attributes:
        hardware_id, reference_hardware: the cards.
        eval_pairs, pool_pairs, learned_left_out: sizes (CardRoles).
        settings: setting name -> forecaster (a classical kind, or a reference forecaster) -> `scores`.
        models: "reference" / "card" -> kind -> the registered version's model_ref it stands for.
        curve: one row per (setting, kind, n): n (0: zero shot; None: all), pairs used, Brier.
        agreement: `bin_agreement`.
        notes: forecasters left out and why.
    """

    hardware_id: str
    reference_hardware: str
    eval_pairs: int
    pool_pairs: int
    learned_left_out: int
    settings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    models: dict[str, dict[str, str]] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    agreement: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def best(self, setting: str) -> tuple[str, float] | None:
        """(forecaster, Brier) of a setting's lowest Brier, the reference forecasters left out."""
        got = {f: s["brier"] for f, s in self.settings.get(setting, {}).items()
               if not f.startswith("baseline:") and s.get("n")}
        return min(got.items(), key=lambda kv: (kv[1], kv[0])) if got else None

    def to_dict(self) -> dict[str, Any]:
        return {"hardware_id": self.hardware_id, "reference_hardware": self.reference_hardware,
                "eval_pairs": self.eval_pairs, "pool_pairs": self.pool_pairs,
                "learned_left_out": self.learned_left_out, "settings": self.settings, "models": self.models,
                "curve": self.curve, "agreement": self.agreement, "notes": self.notes}


@dataclass(frozen=True)
class Carried:
    """A forecaster of the study: its adapter (`forecast_pairs`) and the registered version it is."""

    adapter: Any
    model_ref: str


def study_card(card: CardRoles, reference_models: Mapping[str, Carried], card_models: Mapping[str, Carried],
               records: Mapping[str, Mapping[str, Any]], reference_fit: pl.DataFrame, sizes: Iterable[int],
               kinds: Sequence[str], params: Mapping[str, Mapping[str, Any]] | None = None, n_boot: int = 0,
               seed: int = 0, workers: int | None = None,
               progress: Callable[[str], None] = lambda line: None) -> CardStudy:
    """Score the settings of one target card.

    Args:
        card: the card's roles.
        reference_models: kind -> the reference card's registered version of that kind (the
            classical kinds: they answer any pair here).
        card_models: kind -> the version registered for the card (fitted@all); empty: fitted here.
        records: kernel records of every kernel of the card's eval and pool pairs.
        reference_fit: the reference card's fit pairs (the zero-shot bin prior).
        sizes: pool sizes of the curve (0 and all are always there).
        kinds: classical kinds fitted at each size (an "ensemble" composes the others).
        params: kind -> hyper-parameter overrides.
        n_boot: bootstrap replicates of the Brier intervals (zero shot, calibrated@300 and @all, fitted@all).
        seed: the bootstrap's seed.
        workers: processes fitting side by side (pipelines.surrogates.classical.fit_many).
        progress: receives a line per step.
    Returns:
        The `CardStudy` (agreement left empty: `bin_agreement` fills it from the labels).
    """
    from models.calibration import fit_calibrator

    ev = card.eval
    study = CardStudy(card.hardware_id, card.reference_hardware, ev.height, card.pool.height, card.learned_left_out)
    study.models = {"reference": {k: c.model_ref for k, c in reference_models.items()},
                    "card": {k: c.model_ref for k, c in card_models.items()}}
    if ev.is_empty():
        study.notes.append(f"{card.hardware_id} has no eval pairs")
        return study
    sized = card.sizes(sizes)
    interval = {None, 300}  # the sizes whose Brier gets a bootstrap interval

    def point(setting: str, kind: str, n: int | None, used: int, brier: float, **extra: Any) -> None:
        study.curve.append({"setting": setting, "forecaster": kind, "n": n, "pairs": used, "brier": brier, **extra})

    zero = {"baseline:uniform": scores(uniform(ev.height), ev),
            "baseline:bin_prior": scores(bin_prior(ev, reference_fit), ev, n_boot, seed)}
    eval_p, pool_p = {}, {}
    for kind, carried in sorted(reference_models.items()):
        progress(f"{card.hardware_id}: {carried.model_ref} ({kind}) zero shot, calibrated on up to "
                 f"{card.pool.height} pairs")
        eval_p[kind] = carried.adapter.forecast_pairs(ev, records)
        pool_p[kind] = carried.adapter.forecast_pairs(card.pool, records) if card.pool.height else np.zeros((0, NUM_BINS))
        zero[kind] = scores(eval_p[kind], ev, n_boot, seed)
        point(ZERO_SHOT, kind, 0, 0, zero[kind]["brier"])
    study.settings[ZERO_SHOT] = zero
    y_pool = card.pool["true_bin"].to_numpy().astype(np.int64)
    for n in sized:
        used = card.pool.height if n is None else n
        part = {}
        for kind in sorted(reference_models):
            calibrator = fit_calibrator(pool_p[kind][:used], y_pool[:used])
            part[kind] = scores(calibrator.apply(eval_p[kind]), ev, n_boot if n in interval else 0, seed)
            point(CALIBRATED, kind, n, used, part[kind]["brier"])
        study.settings[setting_name(CALIBRATED, n)] = part
    fitted = _fitted(card, sized, card_models, records, kinds, params, workers, progress)
    for n in sized:
        used = card.pool.height if n is None else n
        fit, calibration = card.fit_and_calibration(n)
        part = {"baseline:bin_prior": scores(bin_prior(ev, card.first(n)), ev)}
        for kind, adapter in sorted(fitted.get(n, {}).items()):
            part[kind] = scores(adapter.forecast_pairs(ev, records), ev, n_boot if n is None else 0, seed)
            point(FITTED, kind, n, used, part[kind]["brier"], fit_pairs=fit.height, calibration_pairs=calibration.height)
        study.settings[setting_name(FITTED, n)] = part
    return study


def _fitted(card: CardRoles, sized: Sequence[int | None], registered: Mapping[str, Carried],
            records: Mapping[str, Mapping[str, Any]], kinds: Sequence[str],
            params: Mapping[str, Mapping[str, Any]] | None, workers: int | None,
            progress: Callable[[str], None]) -> dict[int | None, dict[str, Any]]:
    """n -> kind -> adapter of the forecaster fitted on the first n pool pairs; at n = all, the
    versions registered for the card when there are any (else fitted here too)."""
    from models.classical import COMPOSED_KINDS
    from models.classical.ensemble import EnsembleModel
    from pipelines.forecasting.classical import ClassicalForecaster
    from pipelines.surrogates.classical import fit_many

    base = [k for k in kinds if k not in COMPOSED_KINDS]
    todo = [n for n in sized if n is not None or not registered]
    roles = card.roles(todo)
    jobs = [(kind, "in_distribution" if n is None else setting_name(FITTED, n), dict((params or {}).get(kind, {})))
            for n in todo for kind in base]
    fits = fit_many(jobs, roles, records, workers=workers,
                    progress=lambda line: progress(f"{card.hardware_id}: {line}")) if jobs else []
    models: dict[int | None, dict[str, Any]] = {}
    for (kind, split, _), got in zip(jobs, fits, strict=True):
        n = None if split == "in_distribution" else int(split.rsplit("@", 1)[1])
        models.setdefault(n, {})[kind] = got.model
    for n, by_kind in models.items():
        if "ensemble" in kinds and by_kind:
            fit, _ = card.fit_and_calibration(n)
            by_kind["ensemble"] = EnsembleModel.from_members(list(by_kind.values()), fit["task"].to_list(),
                                                             fit["true_bin"].to_list())
    out = {n: {kind: ClassicalForecaster(m, setting_name(FITTED, n) + f":{kind}", kind) for kind, m in by_kind.items()}
           for n, by_kind in models.items()}
    if registered and None in sized:
        out[None] = {kind: c.adapter for kind, c in registered.items()}
    return out
