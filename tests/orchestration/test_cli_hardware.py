"""`kernelcast forecast --hardware`: the card's own champion (@champion-<card>) answers for it; a
card without one gets the reference card's champion and the output says which card that version
was fitted on; `kernelcast promote` takes a card's alias; `kind:` never resolves to another card's
version. A registry of two small cost models, one per card (models.registry.hardware)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestration.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "forecasting"))
from test_forecasting_models import toy_pairs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
H200, H100, A100 = "nvidia-h200-sm90", "nvidia-h100-80gb-hbm3-sm90", "nvidia-a100-sxm4-80gb-sm80"
SOFTMAX = REPO / "pipelines" / "generation" / "handwritten" / "softmax"
runner = CliRunner()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A home whose registry holds a cost model fitted for each card: the H200 one @champion (the
    reference card's), the H100 one @champion-h100. Returns (home, {card: version})."""
    from models.classical import CostModel
    from models.classical.registry import log_classical
    from models.registry.hardware import HARDWARE_TAG, set_reference_hardware
    from models.registry.versions import set_alias

    home = tmp_path_factory.mktemp("home")
    uri = f"sqlite:///{(home / 'mlflow.db').resolve()}"
    versions = {}
    for seed, card in ((0, H200), (1, H100)):
        fit, y, l2 = toy_pairs(120, seed)
        model = CostModel(max_iter=20)
        model.fit(fit, y, l2)
        _, versions[card] = log_classical(model, uri, fit.head(4), "kernelcast-surrogate", "ds-test",
                                          "in_distribution", tags={"kind": "cost_model", HARDWARE_TAG: card})
    set_reference_hardware(uri, "kernelcast-surrogate", H200)
    set_alias(uri, "champion", versions[H200])
    set_alias(uri, "champion-h100", versions[H100])
    return home, versions


def _forecast(home: Path, monkeypatch, *extra: str) -> tuple[dict, str]:
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    res = runner.invoke(app, ["forecast", "--task", "softmax", "--anchor", str(SOFTMAX / "pytorch_decomposed.py"),
                              "--candidate", str(SOFTMAX / "native_bf16.py"), "--json", *extra])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout[res.stdout.index("["):])
    return row, res.output


def test_forecast_picks_the_champion_of_the_card_it_is_asked_for(registry, monkeypatch):
    home, versions = registry
    row, _ = _forecast(home, monkeypatch, "--hardware", H100)
    assert row["model_version"] == versions[H100] and row["hardware_id"] == H100
    assert row["model_uri"] == "models:/kernelcast-surrogate@champion-h100"
    assert "fitted on " + H100 in row["hardware_note"]
    assert len(row["p"]) == 8 and abs(sum(row["p"]) - 1) < 1e-6

    row, _ = _forecast(home, monkeypatch, "--hardware", H200)  # the reference card: its champion, nothing to say
    assert row["model_version"] == versions[H200] and "hardware_note" not in row


def test_a_card_without_a_champion_is_told_which_card_answered(registry, monkeypatch):
    home, versions = registry
    row, _ = _forecast(home, monkeypatch, "--hardware", A100)
    assert row["model_version"] == versions[H200]
    assert row["hardware_note"].startswith(f"no version fitted on {A100} (@champion-a100 is not set)")
    assert row["hardware_note"].endswith(f"fitted on {H200}")
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "100")
    text = runner.invoke(app, ["forecast", "--task", "softmax", "--anchor", str(SOFTMAX / "pytorch_decomposed.py"),
                               "--candidate", str(SOFTMAX / "native_bf16.py"), "--hardware", A100])
    assert text.exit_code == 0 and f"hardware: no version fitted on {A100}" in text.output
    assert all(len(line) <= 100 for line in text.output.splitlines()), text.output  # the note wrapped


def test_promote_takes_a_card_alias_and_kind_stays_on_the_reference_card(registry, monkeypatch):
    from models.registry.versions import alias_version
    from pipelines.forecasting import resolve_version

    home, versions = registry
    uri = f"sqlite:///{(home / 'mlflow.db').resolve()}"
    monkeypatch.setenv("KERNELCAST_HOME", str(home))
    res = runner.invoke(app, ["promote", "--version", str(versions[H100]), "--alias", "champion-a100", "--json"])
    assert res.exit_code == 0, res.output
    assert alias_version(uri, "champion-a100") == versions[H100]
    bad = runner.invoke(app, ["promote", "--version", str(versions[H100]), "--alias", "champion-", "--json"])
    assert bad.exit_code == 2 and "champion-<card>" in bad.output
    # the H100 version is the newest cost model, yet kind: answers with the reference card's
    assert resolve_version(uri, "kind:cost_model")[1] == versions[H200] < versions[H100]
