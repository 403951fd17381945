"""The cross-hardware settings of the current dataset version, read from the warehouse and the
registry: each target card's roles, and the versions fitted on each target card.

    roles, cards = card_roles_of(con, version, curation)       # card -> CardRoles
    registered = train_card_forecasters(path, uri, sur, cur, batch, tags)   # tag hardware=<card>

The pairs are pipelines.surrogates.cross_hardware's; this module only reads and registers. The
study that scores the settings is pipelines.evaluation.card_study.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

from models.registry import SURROGATE_MODEL
from pipelines.surrogates.cross_hardware import CardRoles, card_roles, learned_kernels

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
                           tags: Mapping[str, str], progress: Callable[[str], None] | None = None, *,
                           model_logger: Callable[[Any, Any], Any]) -> CardVersions:
    """Fit, calibrate and register the classical kinds on every pair of each target card (its
    `fitted@all` setting), as versions of the surrogate's model tagged with the card; a version
    of the same kind, dataset version, code and card is re-used; `model_logger` is what each
    version is logged as (pipelines.surrogates.classical.train_and_register).

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
                                             progress=progress, model_logger=model_logger)]
    if registered and roles.hardware_id:
        set_reference_hardware(tracking_uri, SURROGATE_MODEL, roles.hardware_id)
    return CardVersions(version, roles.hardware_id, registered, sizes)
