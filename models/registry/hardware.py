"""Versions per GPU type in the registry: the `hardware` tag, the reference card, the card aliases.

Every version a run fits is tagged `hardware` with the card whose pairs it was fitted on. The
registered model itself is tagged `reference_hardware` (the card of the in-distribution setting,
pipelines.curation.hardware), so a reader that names no card (`kind:cost_model`, the search's
forecaster) gets a version of the reference card; a version without the tag predates it and was
fitted on the reference card. The reference card's champions are `@champion` and
`@champion-external` (models.registry.versions); each other card has `@champion-<card>`
(`champion-h100`; `card_name` shortens the hardware id), moved by pipelines.promotion.hardware.

    fitted_for(info, "nvidia-h100-80gb-hbm3-sm90")         # a version_info dict of that card?

This module never imports dagster; the tracking URI is a plain string.
"""

from __future__ import annotations

import re
from typing import Any

from models.registry.versions import (
    _client,
    find_versions,
    set_model_tags,
)

HARDWARE_TAG = "hardware"  # on a version: the card it was fitted on
REFERENCE_TAG = "reference_hardware"  # on the registered model: its in-distribution card


def fitted_for(info: dict[str, Any], hardware_id: str | None, reference: str | None = None) -> bool:
    """Whether a version (a `version_info` dict) was fitted on `hardware_id`: its tag says so, or it
    has none and `hardware_id` is the reference card (or either is unknown).

    >>> v = {"tags": {"hardware": "b"}}
    >>> fitted_for(v, "b"), fitted_for(v, "a"), fitted_for({"tags": {}}, "a", reference="a"), fitted_for({"tags": {}}, "b", "a")
    (True, False, True, False)
    """
    tag = (info.get("tags") or {}).get(HARDWARE_TAG)
    if tag is not None:
        return hardware_id is None or tag == hardware_id
    return hardware_id is None or reference is None or hardware_id == reference


def model_tag(tracking_uri: str, name: str, key: str) -> str | None:
    """A tag of the registered model, or None (not set, or no such model)."""
    from mlflow.exceptions import MlflowException

    try:
        return _client(tracking_uri).get_registered_model(name).tags.get(key)
    except MlflowException:  # no such model yet
        return None


def reference_hardware(tracking_uri: str, name: str) -> str | None:
    """The registered model's reference card, or None (no tag, or no such model)."""
    return model_tag(tracking_uri, name, REFERENCE_TAG)


def set_reference_hardware(tracking_uri: str, name: str, hardware_id: str) -> None:
    """Record the registered model's reference card (idempotent)."""
    if reference_hardware(tracking_uri, name) != hardware_id:
        set_model_tags(tracking_uri, name, {REFERENCE_TAG: hardware_id})


def reference_versions(tracking_uri: str, name: str, **tags: str) -> list[dict[str, Any]]:
    """`find_versions` of `name` left to the versions of its reference card, newest first."""
    reference = reference_hardware(tracking_uri, name)
    return [v for v in find_versions(tracking_uri, name, **tags) if fitted_for(v, reference, reference)]


def card_name(hardware_id: str) -> str:
    """The short name of a card in alias names: its model token ('h100', 'a100', 'mi300'), else
    the id's letters and digits.

    >>> card_name("nvidia-h100-80gb-hbm3-sm90"), card_name("nvidia-h200-sm90"), card_name("cpu")
    ('h100', 'h200', 'cpu')
    >>> card_name("amd-instinct-mi300x-gfx942"), card_name("Some Card!")
    ('mi300x', 'some-card')
    """
    tokens = [t for t in re.split(r"[^a-z0-9]+", hardware_id.lower()) if t]
    vendors = {"nvidia", "amd", "intel", "instinct", "geforce", "tesla", "rtx"}
    for t in tokens:
        if t not in vendors and re.fullmatch(r"[a-z]{1,3}\d{2,4}[a-z]?", t) and not t.startswith("sm"):
            return t
    return "-".join(t for t in tokens if t not in vendors) or "card"


def champion_alias(hardware_id: str) -> str:
    """The alias of a card's champion.

    >>> champion_alias("nvidia-h100-80gb-hbm3-sm90")
    'champion-h100'
    """
    return f"champion-{card_name(hardware_id)}"
