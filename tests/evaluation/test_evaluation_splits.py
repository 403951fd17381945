"""The report's four splits: which forecaster is scored where and on which records, the
forecaster listing the evaluation needs, the HTML pages and their links and footnotes, the
selective coverage of the external split, and `kernelcast report` over all of it."""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl
import pytest

from models.bins import speedup_to_bin
from pipelines.forecasting.registered import SOURCE_ONLY_SUFFIX, split_frames
from pipelines.surrogates.roles import Roles, strip_metadata

P = [f"p{i}" for i in range(1, 9)]
BLOCKS = (64, 128, 256, 512, 1024, 2048)


def _records_and_pairs(n: int, seed: int, prefix: str, generator: str = "kernelcast-space"):
    """Kernel records (a reference anchor, candidates whose BLOCK_N knob sets the speedup) and
    their reference pairs."""
    rng = random.Random(seed)
    records = {"ref": {"kernel_id": "ref", "task": "softmax", "source": "def ref_kernel(x): return x.softmax(-1)\n",
                       "language": "pytorch", "generator": "reference", "algorithm": None, "knobs_json": None}}
    rows = []
    for i in range(n):
        b = rng.choice(BLOCKS)
        s = 2.0 ** (-2.4 + 0.9 * BLOCKS.index(b) + rng.gauss(0, 0.1))
        kid = f"{prefix}{i}"
        records[kid] = {"kernel_id": kid, "task": "softmax", "language": "triton", "generator": generator,
                        "algorithm": "two_pass", "knobs_json": json.dumps({"BLOCK_N": b}),
                        "source": f"@triton.jit\ndef k(x):\n    tl.load(x)\n{'    tl.store(x)' * (i % 3)}\n"}
        rows.append({"pair_id": f"p-{kid}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
                     "candidate_kernel_id": kid, "speedup": s, "true_bin": speedup_to_bin(s), "pair_type": "reference",
                     "split": "eval"})
    return records, pl.DataFrame(rows)


@pytest.mark.slow
def test_every_split_is_forecast_and_source_only_from_stripped_records(tmp_path):
    """A registered cost model forecasts the eval pairs, the same pairs from records without the
    generator's metadata (other numbers: the knob is withheld), and the external pairs."""
    from models.classical import CostModel
    from models.classical.registry import log_classical
    from pipelines.forecasting.registered import (
        empty_reasons,
        reference_listing,
        registered_forecasts,
        split_pairs,
    )
    from pipelines.surrogates.classical import frame_of

    fit_records, fit = _records_and_pairs(240, 0, "f")
    model = CostModel(max_iter=40, metadata_dropout=0.0).fit(frame_of(fit, fit_records), fit["true_bin"].to_numpy(), np.log2(fit["speedup"].to_numpy()))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id, version = log_classical(model, uri, frame_of(fit.head(4), fit_records), "kernelcast-surrogate", "ds-x",
                                    "in_distribution")
    ev_records, ev = _records_and_pairs(30, 1, "e")
    ext_records, ext = _records_and_pairs(12, 2, "x", generator="rewrite:unroll")
    records = {**ev_records, **ext_records}
    empty = ev.head(0)
    roles = Roles(fit, empty, ev, empty, empty, empty, None, ext)
    rows, listed, jobs = registered_forecasts(uri, "ds-x", roles, records, tmp_path, None, lambda p, s: [], None)
    ref = f"models:/kernelcast-surrogate/{version}"
    assert jobs == []
    assert {(f.model_ref, f.split) for f in listed} == {(ref, "in_distribution"), (ref + SOURCE_ONLY_SUFFIX, "source_only"),
                                                        (ref, "external")}
    assert {f.run_id for f in listed} == {run_id}
    mine = rows.filter(pl.col("model_ref") == ref)
    assert sorted(mine["pair_id"].to_list()) == sorted(ev["pair_id"].to_list() + ext["pair_id"].to_list())
    stripped = rows.filter(pl.col("model_ref") == ref + SOURCE_ONLY_SUFFIX).sort("pair_id")
    assert stripped["pair_id"].to_list() == sorted(ev["pair_id"].to_list())
    ordered = ev.sort("pair_id")
    want = model.predict_proba(frame_of(ordered, strip_metadata(records)))
    assert np.allclose(stripped.select(P).to_numpy(), want)
    with_meta = mine.filter(pl.col("pair_id").is_in(ev["pair_id"].to_list())).sort("pair_id").select(P).to_numpy()
    assert not np.allclose(with_meta, want)  # fitted with the knob (no dropout): it mattered, and it was withheld

    # the listing the asset writes, and the four splits read back from stored rows
    listing = json.loads(json.dumps({"pairs": split_pairs(roles), "empty": empty_reasons(roles, "ds-x"),
                                     "forecasters": [f.__dict__ for f in reference_listing(roles) + listed]}))
    assert set(listing["empty"]) == {"held_out_task"}
    pairs = pl.concat([ev, ext]).rename({"speedup": "true_speedup"})
    frame = rows.join(pairs, on="pair_id")
    parts = split_frames(frame, listing)
    assert set(parts) == {"in_distribution", "source_only", "external"}
    assert set(parts["source_only"]["model_ref"]) == {ref}  # the twin renamed to its forecaster
    assert np.allclose(parts["source_only"].sort("pair_id").select(P).to_numpy(), want)
    assert set(parts["external"]["pair_id"]) == set(ext["pair_id"])
    assert set(parts["in_distribution"]["pair_id"]) == set(ev["pair_id"])


def _frame(refs_pairs: dict[str, list[str]], split: str = "eval") -> pl.DataFrame:
    rows = []
    for ref, pairs in refs_pairs.items():
        for i, pid in enumerate(pairs):
            p = [0.0] * 8
            p[i % 8] = 1.0
            rows.append({"pair_id": pid, "model_ref": ref, "repeat": 0, "parse_ok": True, "predicted_bin": i % 8 + 1,
                         **dict(zip(P, p)), "task": "t", "true_speedup": 2.0 ** (i % 8 - 3.5), "split": split,
                         "pair_type": "reference", "hardware_id": "h", "anchor_kernel_id": "ref", "candidate_kernel_id": pid})
    return pl.DataFrame(rows)


def test_split_frames_give_each_split_its_forecasters_and_pairs():
    ev, ext, held = ["e1", "e2", "e3"], ["x1", "x2"], ["e3", "h1"]
    v, h = "models:/kernelcast-surrogate/1", "models:/kernelcast-surrogate-held-out/1"
    frame = pl.concat([_frame({v: ev + ext, v + SOURCE_ONLY_SUFFIX: ev, "baseline:uniform": ev + ext + ["h1"],
                               h: held, "baseline:uniform|held_out_task": held})])
    listing = {"pairs": {"in_distribution": ev, "source_only": ev, "held_out_task": held, "external": ext},
               "forecasters": [{"model_ref": v, "split": "in_distribution"}, {"model_ref": v + SOURCE_ONLY_SUFFIX, "split": "source_only"},
                               {"model_ref": v, "split": "external"}, {"model_ref": h, "split": "held_out_task"},
                               {"model_ref": "baseline:uniform|held_out_task", "split": "held_out_task"},
                               *({"model_ref": "baseline:uniform", "split": s} for s in ("in_distribution", "source_only", "external"))]}
    parts = split_frames(frame, listing)
    got = {s: sorted(set(part.select("model_ref", "pair_id").rows())) for s, part in parts.items()}
    assert got["in_distribution"] == sorted((r, p) for r in (v, "baseline:uniform") for p in ev)
    assert got["source_only"] == sorted((r, p) for r in (v, "baseline:uniform") for p in ev)
    assert got["external"] == sorted((r, p) for r in (v, "baseline:uniform") for p in ext)
    assert got["held_out_task"] == sorted((r, p) for r in (h, "baseline:uniform|held_out_task") for p in held)
    # an empty external split is left out, never an error
    none = {**listing, "pairs": {**listing["pairs"], "external": []}}
    assert "external" not in split_frames(frame, none)


def test_a_listing_without_its_pairs_is_refused_in_one_line():
    with pytest.raises(ValueError, match="lacks pairs") as err:
        split_frames(_frame({"baseline:uniform": ["e1"]}), {"forecasters": []})
    assert "\n" not in str(err.value)


def test_the_evaluation_refuses_a_missing_listing(tmp_path):
    """No forecaster listing in the warehouse: calibration_report fails in one line (no silent {})."""
    import dagster as dg

    from assets.evaluation import evaluation_reports
    from orchestration.resources import MlflowResource, SettingsResource, WarehouseResource
    from warehouse.datasets import current_dataset_version
    from warehouse.db import connect

    db = tmp_path / "w.duckdb"
    with connect(db) as con:  # a fresh warehouse: migrations applied, one dataset version
        con.execute("INSERT INTO dataset_versions VALUES ('ds-1', 'd', NULL, 0, now())")
        assert current_dataset_version(con) == "ds-1"
    with pytest.raises(dg.Failure, match="no forecaster listing") as err:
        list(evaluation_reports(dg.build_asset_context(),
                                settings=SettingsResource(profile="smoke", home=str(tmp_path / "home")),
                                warehouse=WarehouseResource(path=str(db)),
                                mlflow=MlflowResource(tracking_uri=f"sqlite:///{tmp_path}/m.db", artifact_root=str(tmp_path / "a"))))
    assert "dataset version ds-1" in str(err.value) and "\n" not in str(err.value)


def _toy_forecasts(seed: int, n: int = 40) -> pl.DataFrame:
    """Oracle, uniform and a noisy forecaster on n pairs of two tasks; ties in the oracle's bins."""
    from models import baselines

    rng = np.random.default_rng(seed)
    s = 2.0 ** rng.uniform(-3, 3, n)
    pairs = pl.DataFrame({"pair_id": [f"p{i}" for i in range(n)], "task": ["a", "b"] * (n // 2), "speedup": s,
                          "true_bin": [speedup_to_bin(v) for v in s], "hardware_id": "h", "anchor_kernel_id": "ref",
                          "candidate_kernel_id": [f"k{i}" for i in range(n)], "pair_type": "reference"})
    frames = [baselines.oracle_forecasts(pairs).with_columns(pl.lit("baseline:oracle").alias("model_ref")),
              baselines.uniform_forecasts(pairs).with_columns(pl.lit("baseline:uniform").alias("model_ref"))]
    y = pairs["true_bin"].to_numpy()
    p = np.full((n, 8), 0.02)
    guess = np.where(rng.uniform(size=n) < 0.6, y, rng.integers(1, 9, n))
    p[np.arange(n), guess - 1] = 0.86
    conf = pl.DataFrame({"pair_id": pairs["pair_id"], "repeat": 0, "parse_ok": True, "predicted_bin": guess,
                         **{c: p[:, i] for i, c in enumerate(P)}, "model_ref": "models:/kernelcast-surrogate/1"})
    frames.append(pairs.join(conf, on="pair_id"))
    keep = ["pair_id", "model_ref", "repeat", "parse_ok", "predicted_bin", *P]
    return pl.concat([f.select(keep) for f in frames], how="vertical_relaxed").join(pairs.rename({"speedup": "true_speedup"}), on="pair_id")


def test_every_page_links_the_others_and_its_footnote_is_the_table_s_number(tmp_path):
    import re

    from pipelines.evaluation.suite import evaluate_models, write_split_reports

    results = {s: evaluate_models(_toy_forecasts(i), n_boot=0) for i, s in enumerate(("in_distribution", "source_only", "held_out_task"))}
    runs = {"models:/kernelcast-surrogate/1": ("abc123", "http://127.0.0.1:5000/#/runs/abc123")}
    pages = write_split_reports(results, tmp_path, "ds-1", runs, {"external": "no kernel outside the templates"})
    assert pages["in_distribution"] == tmp_path / "index.html"
    for split, page in pages.items():
        html = page.read_text()
        hrefs = re.findall(r'<a href="([^"]+)">', html)
        targets = {(page.parent / h).resolve() for h in hrefs if not h.startswith("http")}
        assert targets == {p.resolve() for s, p in pages.items() if s != split}, split  # every other page, existing
        assert all(t.is_file() for t in targets)
        assert '<a data-ui="mlflow" href="http://127.0.0.1:5000/#/runs/abc123" title="abc123">abc123</a>' in html
        assert "external: empty (no kernel outside the templates)" in html
        # the report's path under the home (the browser shows where it is opened from)
        assert f"$KERNELCAST_HOME/{page.relative_to(tmp_path.parent.parent)}" in html
        oracle = results[split]["baseline:oracle"]["recovered_mean"]
        assert oracle < 1.0  # bins tie: the oracle gets its within-bin expectation
        assert f"Oracle (knows the true bin) recovered = {oracle:.3f}" in html
        assert "Oracle recovered = 1.0" not in html


def test_selective_coverage_reaches_the_best_brier():
    from pipelines.evaluation.scores import brier
    from pipelines.evaluation.suite import selective_coverage

    frame = _toy_forecasts(5)
    out = selective_coverage(frame)
    cov = out["coverage"]
    assert out["best"] != "baseline:oracle" and set(cov) == set(frame["model_ref"].unique())
    assert cov[out["best"]] == 1.0 and cov["baseline:oracle"] == 1.0
    # recompute the noisy forecaster's coverage by hand: its most confident forecasts first
    mine = frame.filter(pl.col("model_ref") == "models:/kernelcast-surrogate/1")
    b = brier(mine.select(P).to_numpy(), mine["true_bin"].to_numpy())
    if out["best"] == "baseline:uniform":  # 0.4375 everywhere; its right guesses reach it, its wrong ones do not
        order = np.argsort(-mine.select(P).to_numpy().max(axis=1), kind="stable")
        means = np.cumsum(b[order]) / np.arange(1, b.size + 1)
        assert 0.0 < cov["models:/kernelcast-surrogate/1"] <= 1.0
        assert means[int(round(cov["models:/kernelcast-surrogate/1"] * b.size)) - 1] <= out["target_brier"] + 1e-9


def test_report_table_carries_every_split_runs_and_the_report_path():
    from orchestration.cli_report import table_lines
    from pipelines.evaluation.forecaster_table import forecaster_rows
    from pipelines.evaluation.suite import evaluate_models, selective_coverage
    from pipelines.surrogates.roles import split_title

    runs = {"models:/kernelcast-surrogate/1": ("abc123", "http://127.0.0.1:5000/#/runs/abc123")}
    rows = []
    for i, split in enumerate(("in_distribution", "source_only", "external")):
        frame = _toy_forecasts(i)
        cov = selective_coverage(frame)["coverage"] if split == "external" else None
        rows += forecaster_rows(evaluate_models(frame, n_boot=0), {}, split, None, runs, cov)
    keys = {"name", "kind", "split", "source", "n", "brier", "brier_lo", "brier_hi", "crps", "ece", "accuracy",
            "recovered_mean", "recovered_lo", "recovered_hi", "recovered_random", "parse_rate"}
    assert all(keys <= set(r) for r in rows)
    assert {r["split"] for r in rows} == {"in_distribution", "source_only", "external"}
    assert all((r["run_id"] == "abc123") == r["name"].startswith("models:/") for r in rows)
    assert all((r["selective_coverage"] is not None) == (r["split"] == "external") for r in rows)
    table = {"dataset_version": "ds-1", "held_out_task": None, "report": "/r/ds-1/index.html",
             "evaluation_run_id": "ev1", "evaluation_run_url": "http://127.0.0.1:5000/#/runs/ev1",
             "empty_splits": {"held_out_task": "no held-out task in dataset version ds-1"},
             "selective_external": {"target_brier": 0.4375, "best": "baseline:uniform"}, "forecasters": rows}
    aliases = {"models:/kernelcast-surrogate/1": ["champion", "challenger-external"]}
    short = table_lines(table, aliases)
    text = "\n".join(short)
    for split in ("in_distribution", "source_only", "external"):
        assert split_title(split) + ":" in text
    assert "held-out task: empty (no held-out task in dataset version ds-1)" in text
    assert "report: /r/ds-1/index.html" in text and "evaluation run" not in text
    assert short[-1] == "MLflow and Dagster runs of each forecaster: kernelcast report --links (or --json)"
    # every table row of version 1 is marked with both aliases; the rows fit 100 columns
    marked = [line for line in short if line.startswith("surrogate/1 ")]
    assert len(marked) == 3 and all(line.endswith("@champ @chall-ext") for line in marked)
    assert max(len(line) for line in short if not line.startswith(("report", "  cover"))) <= 100
    linked = "\n".join(table_lines(table, aliases, links=True))
    assert "evaluation run: ev1" in linked
    assert "run surrogate/1: abc123 http://127.0.0.1:5000/#/runs/abc123" in linked


def _write_folder(folder, n: int = 6):
    """A fetched-kernels folder as the worker writes it: a kernels file and a results file (one
    kernel failed, one of another protocol), in the project's own schemas."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from warehouse.formats import KERNEL_BATCH_SCHEMA, RESULT_SCHEMA

    folder.mkdir(parents=True)
    kernels, results = [], []
    for i in range(n):
        kid = f"fetched-{i}"
        kernels.append({"kernel_id": kid, "task": "softmax", "source": f"def custom_kernel(x):\n    return x.softmax(-1)  # {i}\n",
                        "language": "pytorch", "generator": None if i % 2 else "kernelcast-space"})
        status = "failed" if i == n - 1 else "ok"
        results.append({"batch_id": "b", "kernel_id": kid, "task": "softmax", "status": status,
                        "speedup": 2.0 ** (i - 2) if status == "ok" else None, "protocol": "kernelcast" if i else "paper",
                        "harness_version": "1", "hardware_id": "h", "hardware_json": "{}",
                        "measured_at": dt.datetime(2026, 12, 1, tzinfo=dt.UTC)})
    pq.write_table(pa.Table.from_pylist(kernels, schema=KERNEL_BATCH_SCHEMA), folder / "kernels-fetched.parquet")
    pq.write_table(pa.Table.from_pylist(results, schema=RESULT_SCHEMA), folder / "results-fetched.parquet")


def test_a_folder_of_published_kernels_becomes_library_pairs_scored_by_the_references(tmp_path):
    from pipelines.forecasting.registered import folder_forecasts
    from pipelines.surrogates.library_dir import read_library_dir

    _write_folder(tmp_path / "fetched")
    pairs, records = read_library_dir(tmp_path / "fetched", {"softmax": "ref"})
    # the paper-protocol kernel and the failed one never label; the rest pair with the reference
    assert sorted(pairs["candidate_kernel_id"].to_list()) == [f"fetched-{i}" for i in range(1, 5)]
    assert set(pairs["anchor_kernel_id"]) == {"ref"} and set(pairs["split"]) == {"library"}
    assert pairs.filter(pl.col("candidate_kernel_id") == "fetched-3")["speedup"].item() == 2.0
    assert all(r["generator"].startswith("library:") for r in records.values())  # none is the template's
    train = pl.DataFrame({"task": ["softmax"] * 3, "true_bin": [1, 4, 4], "speedup": [0.1, 0.9, 0.95]})
    anchor = {"ref": {"kernel_id": "ref", "task": "softmax", "source": "x", "generator": "reference"}}
    rows, listed = folder_forecasts([], pairs, {**records, **anchor}, "", tmp_path, None, train)
    assert {f.model_ref for f in listed} == {"baseline:uniform", "baseline:bin_prior", "baseline:oracle"}
    assert {f.split for f in listed} == {"library"} and rows.height == 3 * pairs.height


def test_a_library_folder_holding_a_kernel_that_is_learned_from_is_refused(tmp_path):
    """No library id may reach a training split: a folder sharing a kernel with the version's
    fit, calibration or eval pairs is refused whole, in one line."""
    from pipelines.surrogates.library_dir import read_library_dir

    _write_folder(tmp_path / "fetched")
    with pytest.raises(ValueError, match=r"holds 1 kernel\(s\) the dataset version learns from \(e.g. fetched-2\)"):
        read_library_dir(tmp_path / "fetched", {"softmax": "ref"}, {"fetched-2", "other"})


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "is not a folder"),
    (lambda d: d.mkdir(), "holds no kernels"),
    (lambda d: (d.mkdir(), (d / "kernels-x.parquet").write_text("no"), (d / "results-x.parquet").write_text("no")), "unreadable"),
])
def test_a_bad_external_folder_is_one_line(tmp_path, make, message):
    from pipelines.surrogates.library_dir import read_library_dir

    make(tmp_path / "ext")
    with pytest.raises(ValueError, match=message) as err:
        read_library_dir(tmp_path / "ext", {"softmax": "ref"})
    assert "\n" not in str(err.value)


def test_library_kernels_are_scored_on_what_the_file_reader_gives_a_users_file(tmp_path):
    """The library split's records are read as `kernelcast forecast` reads files (trace and compile
    features, cached under the home), so its scores say how forecasters do on a user's file."""
    from pipelines.forecasting.plan import _as_read

    good = "import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n    return torch.softmax(x.float(), -1).to(x.dtype)\n"
    bad = "import not_a_package\n\n\ndef custom_kernel(data):\n    return data[0]\n"
    records = {k: {"kernel_id": k, "task": "softmax", "source": src, "language": "pytorch", "generator": "library:x"}
               for k, src in (("good", good), ("bad", bad))}
    said = []
    out = _as_read(records, tmp_path, said.append)
    assert out["good"]["trace_cases"] == 4 and out["good"]["torch_ops"] >= 2 and out["good"]["generator"] == "library:x"
    assert out["bad"] == records["bad"] and said == [
        "library kernel bad (softmax) refused by the reader: does not import: ModuleNotFoundError: "
        "No module named 'not_a_package'"]
    assert any((tmp_path / "feature-cache").rglob("*"))  # a second run reads the cache


def test_a_source_only_split_that_changes_no_forecast_is_one_line_not_a_second_page(tmp_path):
    """Where no forecaster reads generator metadata, source only repeats in distribution number for
    number: the report says so once instead of a page (and `kernelcast report` a table) of copies."""
    from orchestration.cli_report import table_lines
    from pipelines.evaluation.forecaster_table import forecaster_rows
    from pipelines.evaluation.suite import evaluate_models, same_scores, write_split_reports

    same = evaluate_models(_toy_forecasts(0), n_boot=0)
    results = {"in_distribution": same, "source_only": {f"{k}|source_only": v for k, v in same.items()},
               "external": evaluate_models(_toy_forecasts(1), n_boot=0)}
    pages = write_split_reports(results, tmp_path, "ds-1")
    assert set(pages) == {"in_distribution", "external"} and not (tmp_path / "source_only").exists()
    html = pages["in_distribution"].read_text()
    assert "Source only (generator metadata withheld): the same numbers as in distribution for every forecaster" in html
    assert "source only" not in pages["external"].read_text().split("<nav>")[1].split("</nav>")[0]
    # one forecaster's number differs: a page of its own
    changed = {**results["source_only"], "baseline:uniform|source_only": {**same["baseline:uniform"], "brier": 0.5}}
    assert not same_scores(same, changed, "|source_only")
    assert "source_only" in write_split_reports({**results, "source_only": changed}, tmp_path / "b", "ds-1")

    rows = [r for s, res in results.items() for r in forecaster_rows(res, {}, s)]
    text = table_lines({"forecasters": rows, "same_as": {"source_only": "in_distribution"}})
    assert "source only (generator metadata withheld): the same numbers as in distribution, every forecaster" in text
    assert sum(line.startswith("forecaster") for line in text) == 2  # in distribution and external tables only


def test_a_version_whose_source_only_split_repeats_in_distribution_is_evaluated_and_logged(tmp_path):
    """The whole evaluation of a version (pages, metrics.json per split, the table, the MLflow
    run) where source only changes no forecast: no page of its own, its numbers kept."""
    from types import SimpleNamespace

    from models.registry.tracking import mlflow_experiment
    from pipelines.evaluation.forecaster_table import TABLE_FILE
    from pipelines.evaluation.version_report import VersionForecasts, evaluate_version

    frame = _toy_forecasts(3).with_columns(pl.lit("eval").alias("split"))
    listing = {"held_out_task": None, "empty": {"external": "no kernel outside the templates"},
               "forecasters": [{"model_ref": r, "kind": "baseline", "source": "reference"}
                               for r in ("baseline:oracle", "baseline:uniform")]}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    from mlflow import MlflowClient

    experiment = mlflow_experiment(MlflowClient(uri), uri, "kernelcast-evaluation")
    reports = tmp_path / "home" / "reports"
    ev = evaluate_version(VersionForecasts("ds-1", {"in_distribution": frame, "source_only": frame}, listing), uri,
                          experiment, SimpleNamespace(n_boot=0, workers=1), reports, tmp_path / "cache",
                          ("d-1", "http://127.0.0.1:3000/runs/d-1"), lambda run_id: {}, lambda run_id: f"run {run_id}",
                          progress=lambda line: None)
    assert set(ev.pages) == {"in_distribution"} and set(ev.results) == {"in_distribution", "source_only"}
    folder = reports / "ds-1"
    assert json.loads((folder / "source_only" / "metrics.json").read_text())["baseline:uniform"]["brier"] == 0.4375
    table = json.loads((folder / TABLE_FILE).read_text())
    assert table["same_as"] == {"source_only": "in_distribution"} and table["report"] == "reports/ds-1/index.html"
    assert {r["split"] for r in table["forecasters"]} == {"in_distribution", "source_only"}
    metrics = MlflowClient(uri).get_run(ev.run_id).data.metrics
    assert metrics["baseline-uniform/brier"] == metrics["source_only/baseline-uniform/brier"] == 0.4375
