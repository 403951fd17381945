"""The cross-hardware study of a dataset version: how far forecasters fitted on the reference
card carry to each other card (docs/method.md), scored setting by setting.

The pairs of each setting are pipelines.surrogates.cross_hardware's (`CardRoles`: the eval pairs,
the pool and its fit and calibration parts), the versions fitted on each card
pipelines.surrogates.cards'; here they are forecast and scored, the way the evaluation scores
every forecaster (pipelines.evaluation.scores, bootstrap, calibration). The page is
pipelines.evaluation.cross_hardware.

    studies = study_cards(path, uri, home, sur, cur, sizes, n_boot)   # CardStudy dicts, for the page
    study = study_card(card_roles, reference_models, card_models, records, reference_fit, sizes, kinds)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS, speedups_to_bins
from models.registry import SURROGATE_MODEL
from pipelines.evaluation import scores as sc
from pipelines.evaluation.bootstrap import bootstrap_intervals
from pipelines.evaluation.calibration import expected_calibration_error
from pipelines.forecasting.classical import ClassicalForecaster
from pipelines.surrogates.cards import card_roles_of
from pipelines.surrogates.cross_hardware import (
    CALIBRATED,
    FITTED,
    ZERO_SHOT,
    CardRoles,
    setting_name,
)
from warehouse.bin_edges import P_COLS

# ---------------------------------------------------------------------------- scores

def scores(p: np.ndarray, pairs: pl.DataFrame, n_boot: int = 0, seed: int = 0) -> dict[str, Any]:
    """n, Brier (and its 95% bootstrap interval over pairs, stratified by task), CRPS, NLL,
    accuracy, off-by-one and ECE of forecasts `p` (n, 8) of `pairs` (true_bin, task)."""
    y = pairs["true_bin"].to_numpy().astype(np.int64)
    p = np.asarray(p, dtype=np.float64)
    if not len(y):
        return {"n": 0}
    b = sc.brier(p, y)
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
    return frame.select(P_COLS).to_numpy()


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


def _classical_versions(tracking_uri: str, version: str, hardware_id: str | None, reference: str | None,
                        home: Any) -> dict[str, Carried]:
    """kind -> the newest in-distribution classical version of `version` fitted on `hardware_id`."""
    from models.registry.hardware import fitted_for
    from models.registry.versions import find_versions
    from pipelines.forecasting import load_forecaster
    from pipelines.forecasting.load import CLASSICAL_KINDS

    out: dict[str, Carried] = {}
    for info in find_versions(tracking_uri, SURROGATE_MODEL, dataset_version=version, split="in_distribution"):
        kind = info["tags"].get("kind")
        if kind in CLASSICAL_KINDS and kind not in out and fitted_for(info, hardware_id, reference):
            ref = f"models:/{SURROGATE_MODEL}/{info['version']}"
            out[kind] = Carried(load_forecaster(ref, tracking_uri=tracking_uri, home=home), ref)
    return out


def study_cards(warehouse_path: Any, tracking_uri: str, home: Any, surrogate: Any, curation: Any, sizes: tuple[int, ...],
                n_boot: int, progress: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """Every target card's study (`study_card` and `bin_agreement`), with the reference card's
    in-distribution and external Brier of the same forecasters, as dicts for the page.

    Language-model versions are not carried: committed forecasts hold no pair of another card,
    and reading thousands of pairs with a language model is a GPU's work (the page says so).
    """
    from pipelines.curation.pairs import labels
    from pipelines.surrogates.classical import ids_of, kernel_records
    from pipelines.surrogates.export import latest_version
    from warehouse.db import connect
    from warehouse.measurements import measurements_frame

    with connect(warehouse_path, read_only=True) as con:
        version = latest_version(con)
        roles, cards = card_roles_of(con, version, curation, surrogate.held_out_task)
        if not cards:
            return []
        frames = [roles.eval, roles.external_pairs(), *(f for c in cards.values() for f in (c.eval, c.pool))]
        records = kernel_records(con, ids_of(frames))
        measured = labels(measurements_frame(con))
    reference = roles.hardware_id
    carried = _classical_versions(tracking_uri, version, reference, reference, home)
    ref_scores = {}
    for kind, c in carried.items():
        ext = roles.external_pairs()
        ref_scores[kind] = {"in_distribution": scores(c.adapter.forecast_pairs(roles.eval, records), roles.eval)["brier"],
                            "external": scores(c.adapter.forecast_pairs(ext, records), ext)["brier"] if ext.height
                            else None}
    out = []
    for card, cr in cards.items():
        own = _classical_versions(tracking_uri, version, card, reference, home)
        study = study_card(cr, carried, own, records, roles.fit, sizes, surrogate.classical,
                           params=_params(surrogate), n_boot=n_boot, seed=curation.seed,
                           workers=surrogate.classical_workers, progress=progress)
        study.agreement = bin_agreement(measured, reference, card)
        study.notes += feature_notes(cr.eval, roles.eval, records, card, reference)
        if not carried:
            study.notes.append(f"no classical version fitted on {reference} in dataset version {version}: "
                               "nothing to carry over")
        study.notes.append("Language-model versions are not carried over: their committed forecasts hold no pair of "
                           f"{card}, and a language model's reading of {cr.eval.height + cr.pool.height} pairs is a "
                           "GPU host's work.")
        out.append({**study.to_dict(), "reference_scores": ref_scores, "dataset_version": version})
    return out


FEATURE_MARKS = {"compile": "n_regs", "source": "trace_cases"}  # a field each kind of feature record sets


def feature_coverage(pairs: Any, records: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The share of `pairs`' candidates whose record holds each kind of feature (FEATURE_MARKS).

    >>> import polars as pl
    >>> f = pl.DataFrame({"candidate_kernel_id": ["a", "b"]})
    >>> feature_coverage(f, {"a": {"n_regs": 32, "trace_cases": None}, "b": {}})
    {'compile': 0.5, 'source': 0.0}
    """
    ids = pairs["candidate_kernel_id"].to_list()
    return {kind: (sum(records.get(k, {}).get(mark) is not None for k in ids) / len(ids)) if ids else 0.0
            for kind, mark in FEATURE_MARKS.items()}


def feature_notes(card_eval: Any, reference_eval: Any, records: Mapping[str, Mapping[str, Any]], card: str,
                  reference: str) -> list[str]:
    """A sentence when the card's eval candidates hold fewer features than the reference card's:
    the reference forecasters read what is missing as unknown, so the zero-shot figures then
    measure that gap as well as the card's (data/features holds a kernel's features once computed,
    `python -m pipelines.forecasting.source_features`)."""
    have, want = feature_coverage(card_eval, records), feature_coverage(reference_eval, records)
    short = [f"{kind} features {have[kind]:.0%} (on {reference} {want[kind]:.0%})" for kind in FEATURE_MARKS
             if have[kind] + 0.05 < want[kind]]
    if not short:
        return []
    return [f"Of the eval candidates on {card}, fewer hold their features than on {reference}: " + ", ".join(short)
            + "; the forecasters read the missing ones as unknown."]


def _params(surrogate: Any) -> dict[str, dict[str, Any]]:
    from pipelines.surrogates.classical import classical_params

    return classical_params(surrogate.classical_params)
