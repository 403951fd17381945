"""The cross-hardware assets on a subset of the committed data: H200 run B with its kernels, and
the committed H100 measurements of rewrites of run B's kernels, as two partitions. The reference
card's classical forecasters are fitted on H200 pairs alone; card_forecasters registers versions
fitted on the H100 pairs (tag hardware); cross_hardware_report writes the page, the curve and the
summary; card_champions moves @champion-h100 to one of the H100 versions or says why not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest
from asset_runs import H200_DIR, RUN_B, h100_batch, materialize, materialized

REPO = Path(__file__).resolve().parents[2]
H200, H100 = "nvidia-h200-sm90", "nvidia-h100-80gb-hbm3-sm90"
NAME = "kernelcast-surrogate"


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from orchestration.definitions import build_defs
    from orchestration.settings import load_settings

    root = tmp_path_factory.mktemp("cards-data")
    (root / "measurements" / "h200").mkdir(parents=True)
    for name in ("kernels-2026-11-29-harness1.parquet", RUN_B):
        shutil.copy(H200_DIR / name, root / "measurements" / "h200" / name)
    h100_batch(root / "measurements" / "h100")
    for entry in (REPO / "data").iterdir():
        if entry.name != "measurements":
            (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELCAST_HOME", str(tmp_path_factory.mktemp("cards") / "home"))
        mp.setenv("KERNELCAST_DATA", str(root))
        settings = load_settings("smoke")
        defs = build_defs(settings)
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions("hardware", [H200, H100])
        assert materialize(defs, dg.AssetSelection.assets("kernel_tasks"), instance).success
        for card in (H200, H100):
            assert materialize(defs, dg.AssetSelection.assets("kernel_measurements"), instance, card).success
        selection = dg.AssetSelection.assets("curated_pairs", "eval_set", "rl_training_pool", "discovery_pairs",
                                             "classical_forecasters", "card_forecasters", "cross_hardware_report",
                                             "card_champions")
        result = materialize(defs, selection, instance)
        yield settings, result


@pytest.mark.slow
def test_each_card_gets_its_own_versions_report_and_champion(graph):
    from models.registry.hardware import HARDWARE_TAG, reference_hardware
    from models.registry.versions import alias_version, find_versions

    settings, result = graph
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    assert {"card_forecasters", "cross_hardware_report", "card_champions"} <= materialized(result)
    uri = settings.mlflow_uri
    versions = find_versions(uri, NAME)
    by_card = {}
    for v in versions:
        by_card.setdefault(v["tags"].get(HARDWARE_TAG), set()).add(v["tags"]["kind"])
    assert by_card[H200] == by_card[H100] == set(settings.surrogate.classical)  # one of each kind per card
    assert reference_hardware(uri, NAME) == H200
    with_h100 = [v for v in versions if v["tags"].get(HARDWARE_TAG) == H100]
    assert all(v["tags"]["split"] == "in_distribution" for v in with_h100)

    folder = next((settings.reports_dir).glob("ds-*/cross_hardware"))
    summary = json.loads((folder / "cross_hardware.json").read_text())
    [card] = summary["cards"]
    assert card["hardware_id"] == H100 and card["reference_hardware"] == H200 and card["eval_pairs"] > 0
    assert {"zero_shot", "calibrated@30", "calibrated@all", "fitted@30", "fitted@all"} <= set(card["settings"])
    assert set(card["settings"]["zero_shot"]) >= {"baseline:uniform", "cost_model", "text_model"}
    assert set(card["reference_scores"]) == set(settings.surrogate.classical)
    assert (folder / f"curve-{H100}.png").stat().st_size > 1000 and (folder / "index.html").is_file()
    champion = alias_version(uri, "champion-h100")
    fitted = {int(r.rsplit("/", 1)[1]): card["settings"]["fitted@all"][k]["brier"]
              for k, r in card["models"]["card"].items()}
    if champion is None:  # nothing beat uniform on the card: the decision says so
        assert min(fitted.values()) >= 0.4375
    else:
        assert champion in fitted and fitted[champion] == min(fitted.values()) < 0.4375
    assert alias_version(uri, "champion") is None  # the reference card's rule is not this asset's
