"""The cross-hardware settings of the current dataset version, read from the warehouse and the
registry: the versions fitted on each target card, and each card's study.

    cards = card_roles_of(con, version, curation)               # card -> CardRoles
    registered = train_card_forecasters(path, uri, sur, cur, batch, tags)   # tag hardware=<card>
    studies = study_cards(path, uri, sur, cur, sizes, n_boot)    # CardStudy dicts, for the page

The math is pipelines.surrogates.cross_hardware's; this module only reads and registers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

from models.registry import SURROGATE_MODEL
from pipelines.surrogates.cross_hardware import (
    CardRoles,
    Carried,
    bin_agreement,
    card_roles,
    learned_kernels,
    study_card,
)

log = logging.getLogger(__name__)



def card_roles_of(con: duckdb.DuckDBPyConnection, version: str, curation: Any,
                  held_out_task: str | None = None) -> tuple[Any, dict[str, CardRoles]]:
    """(the reference card's roles, target card -> its CardRoles) of a stored dataset version.

    Args:
        con: an open connection.
        version: the dataset version.
        curation: the curation settings (eval_per_bin, lineage_k, seed).
        held_out_task: the reference roles' held-out task (what its forecasters learned from).
    """
    from pipelines.curation.hardware import other_hardware
    from pipelines.surrogates.export import hardware_lineage, version_hardware, version_roles
    from warehouse.datasets import read_pairs

    reference = version_hardware(con, version)
    roles = version_roles(con, version, held_out_task, reference)
    pairs = read_pairs(con, version)
    learned = learned_kernels(roles)
    cards = {}
    for card in other_hardware(pairs, reference):
        cards[card] = card_roles(pairs.filter(pl.col("hardware_id") == card), hardware_lineage(con, card), reference,
                                 learned, per_bin=curation.eval_per_bin, lineage_k=curation.lineage_k,
                                 seed=curation.seed)
    return roles, cards


@dataclass(frozen=True)
class CardVersions:
    """The versions registered for the target cards of a dataset version."""

    dataset_version: str
    reference_hardware: str | None
    registered: list[tuple[str, Any]]  # (card, pipelines.surrogates.classical.Registered)
    pairs: dict[str, tuple[int, int, int]]  # card -> (eval, fit, calibration) pairs


def train_card_forecasters(warehouse_path: Any, tracking_uri: str, surrogate: Any, curation: Any, batch: str,
                           tags: Mapping[str, str], progress: Callable[[str], None] | None = None) -> CardVersions:
    """Fit, calibrate and register the classical kinds on every pair of each target card (its
    `fitted@all` setting), as versions of the surrogate's model tagged with the card; a version
    of the same kind, dataset version, code and card is re-used.

    Raises:
        NoDatasetVersion: nothing curated yet.
    """
    from models.registry.hardware import set_reference_hardware
    from pipelines.surrogates.classical import (
        classical_params,
        ids_of,
        kernel_records,
        train_and_register,
    )
    from pipelines.surrogates.export import latest_version
    from warehouse.db import connect

    registered, sizes = [], {}
    with connect(warehouse_path) as con:
        version = latest_version(con)
        roles, cards = card_roles_of(con, version, curation, surrogate.held_out_task)
        for card, cr in cards.items():
            card_set = cr.roles()
            sizes[card] = (cr.eval.height, card_set.fit.height, card_set.calibration.height)
            if card_set.fit.is_empty() or cr.eval.is_empty():
                log.info("%s: no pairs to fit on, or none to score: no version", card)
                continue
            records = kernel_records(con, ids_of(card_set.all_frames()))
            registered += [(card, r) for r in train_and_register(con, card_set, records, surrogate.classical, tracking_uri, version, batch,
                                             SURROGATE_MODEL,
                                             tags=tags,
                                             params=classical_params(surrogate.classical_params),
                                             max_fit=surrogate.classical_max_fit, workers=surrogate.classical_workers,
                                             progress=progress)]
    if registered and roles.hardware_id:
        set_reference_hardware(tracking_uri, SURROGATE_MODEL, roles.hardware_id)
    return CardVersions(version, roles.hardware_id, registered, sizes)


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
    from pipelines.surrogates.cross_hardware import scores
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
