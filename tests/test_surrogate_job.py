"""Training on another host, end to end on CPU: export a job from a real warehouse, run
scripts/gpu_train_surrogates.py on it (tiny in-process model, smoke settings), ingest what
it wrote: MLflow run, registry version + lineage row, forecasts in the warehouse, report.

Real parts: the committed H200 measurements curated into a temp DuckDB file by the Dagster
assets, a sqlite MLflow store and registry, the real warm-up + GRPO code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
H200 = "nvidia-h200-sm90"
sys.path.insert(0, str(REPO / "scripts"))

import surrogate_job  # noqa: E402  (scripts/ is not a package)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A KERNELCAST_HOME whose warehouse holds a curated dataset version of the H200 data."""
    from orchestration.definitions import build_defs
    from orchestration.settings import load_settings

    root = tmp_path_factory.mktemp("job")
    env = {"KERNELCAST_HOME": str(root / "home"), "KERNELCAST_DATA": str(REPO / "data")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        defs = build_defs(load_settings("smoke"))
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions("hardware", [H200])
        for names, partition in ((("kernel_tasks",), None), (("kernel_measurements",), H200),
                                 (("curated_pairs", "eval_set", "rl_training_pool", "discovery_pairs"), None)):
            job = dg.define_asset_job("t", selection=dg.AssetSelection.assets(*names))
            resolved = dg.Definitions.merge(defs, dg.Definitions(jobs=[job])).resolve_job_def("t")
            assert resolved.execute_in_process(instance=instance, partition_key=partition).success
        yield root / "home"
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _invoke(*args: str):
    result = CliRunner().invoke(surrogate_job.app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _registered_versions(home):
    from mlflow import MlflowClient

    from orchestration.settings import load_settings

    uri = load_settings("smoke", home).mlflow_uri
    return MlflowClient(uri, registry_uri=uri).search_model_versions("name='kernelcast-surrogate'")


@pytest.mark.slow
def test_export_train_elsewhere_ingest(home, tmp_path):
    from models.tiny import build_tiny_model
    from warehouse.db import connect

    job = tmp_path / "job"
    meta = json.loads(_invoke("export", "--out", str(job), "--style", "diff", "--profile", "smoke",
                              "--home", str(home)).strip().splitlines()[-1])
    train = [json.loads(line) for line in open(job / "train.jsonl")]
    evals = [json.loads(line) for line in open(job / "eval.jsonl")]
    # --gzip writes the same rows gzipped (and only those: a job holds one form of each file)
    import gzip

    gz_job = tmp_path / "gz-job"
    _invoke("export", "--out", str(gz_job), "--style", "diff", "--profile", "smoke", "--home", str(home), "--gzip")
    assert sorted(p.name for p in gz_job.iterdir()) == ["eval.jsonl.gz", "job.json", "measurement_ids.txt", "train.jsonl.gz"]
    with gzip.open(gz_job / "train.jsonl.gz", "rt") as f:
        assert [json.loads(line) for line in f] == train
    assert surrogate_job._job_rows(gz_job, "train") == train
    assert meta["train_rows"] == len(train) > 0 and meta["eval_rows"] == len(evals) > 0
    assert not {r["pair_id"] for r in train} & {r["pair_id"] for r in evals}  # no eval pair trains
    assert len((job / "measurement_ids.txt").read_text().split()) == meta["measurements"] > 0

    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_train_surrogates.py"), "--job", str(job), "--out", str(out),
           "--profile", "smoke", "--variants", "correctness+brier", "--set", f"base_model={tiny}",
           "--set", "sft_steps=2", "--set", "max_steps=1", "--eval-limit", "2", "--repeats", "1",
           "--eval-max-new-tokens", "16", "--base-readouts", "logprob"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"]["correctness+brier"]["steps"] == 1
    assert sorted(p.name for p in out.iterdir()) == [
        "correctness_brier.tar", "forecasts-base-logprob.jsonl", "forecasts-correctness_brier-logprob.jsonl",
        "forecasts-correctness_brier-verbalized.jsonl", "summary.json"]
    assert summary["variants"]["correctness+brier"]["readouts"] == ["logprob", "verbalized"]

    # A corrupt forecast file: one line, and nothing logged, registered or written.
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    path = broken / "forecasts-correctness_brier-verbalized.jsonl"
    path.write_text(path.read_text() + '{"pair_id": "x", "model_ref": "m", "predicted_bin": 9, "parse_ok": tr\n')
    bad = CliRunner().invoke(surrogate_job.app, ["ingest", str(broken), "--job", str(job), "--profile", "smoke",
                                                 "--home", str(home)])
    assert bad.exit_code == 2 and "Invalid value" in bad.output, bad.output
    assert _registered_versions(home) == []

    # A home whose warehouse lacks the job's dataset version: one line, nothing written there.
    from orchestration.settings import load_settings

    other = tmp_path / "other-home"
    bad = CliRunner().invoke(surrogate_job.app, ["ingest", str(out), "--job", str(job), "--profile", "smoke",
                                                 "--home", str(other)])
    said = " ".join(bad.output.replace("│", " ").split())  # rich wraps the message in a box
    assert bad.exit_code == 2 and "has no pairs in" in said, bad.output
    assert _registered_versions(home) == [] and _registered_versions(other) == []
    with connect(load_settings("smoke", other).warehouse_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM forecasts").fetchone()[0] == 0

    report = _invoke("ingest", str(out), "--job", str(job), "--host", "cpu-test", "--alias", "challenger",
                     "--n-boot", "20", "--profile", "smoke", "--home", str(home))
    assert "registered version 1" in report and "models:/kernelcast-surrogate/1|verbalized" in report

    from mlflow import MlflowClient

    from orchestration.settings import load_settings

    cfg = load_settings("smoke", home)
    client = MlflowClient(cfg.mlflow_uri, registry_uri=cfg.mlflow_uri)
    version = client.get_model_version_by_alias("kernelcast-surrogate", "challenger")
    assert int(version.version) == 1 and version.tags["dataset_version"] == meta["dataset_version"]
    run_info = client.get_run(version.run_id)
    assert run_info.data.tags["trained_on"].startswith("cpu-test")
    assert run_info.data.params["reward"] == "correctness+brier" and "train_s" in run_info.data.metrics
    with connect(cfg.warehouse_path, read_only=True) as con:
        lineage = con.execute("SELECT dataset_version FROM model_lineage WHERE model_version = 1").fetchall()
        refs = dict(con.execute("SELECT model_ref, count(*) FROM forecasts GROUP BY 1").fetchall())
    assert lineage == [(meta["dataset_version"],)]
    assert refs == {f"base:{tiny}|logprob|cpu-test": 2, "models:/kernelcast-surrogate/1|logprob": 2,
                    "models:/kernelcast-surrogate/1|verbalized": 2}
    assert (cfg.reports_dir / f"{meta['dataset_version']}-surrogates" / "index.html").is_file()

    # The same results again: nothing registered or logged twice, the forecasts unchanged.
    again = _invoke("ingest", str(out), "--job", str(job), "--host", "cpu-test", "--n-boot", "20",
                    "--profile", "smoke", "--home", str(home))
    assert "already registered as version 1" in again
    assert [int(v.version) for v in _registered_versions(home)] == [1]
    with connect(cfg.warehouse_path, read_only=True) as con:
        assert dict(con.execute("SELECT model_ref, count(*) FROM forecasts GROUP BY 1").fetchall()) == refs
        assert con.execute("SELECT count(*) FROM model_lineage").fetchone()[0] == 1


@pytest.mark.slow
def test_parallel_variants_merge_into_one_results_folder(home, tmp_path):
    """--parallel: one child per variant, the base eval in the parent, one merged folder; a
    deadline that passes before any child finishes leaves those variants under "skipped"."""
    from models.tiny import build_tiny_model

    job = tmp_path / "job"  # gzipped, as it travels to a GPU host
    _invoke("export", "--out", str(job), "--style", "diff", "--profile", "smoke", "--home", str(home), "--gzip")
    tiny = build_tiny_model(tmp_path / "tiny")
    common = [sys.executable, str(REPO / "scripts" / "gpu_train_surrogates.py"), "--job", str(job),
              "--profile", "smoke", "--variants", "correctness,correctness+crps", "--parallel",
              "--set", f"base_model={tiny}", "--set", "sft_steps=1", "--set", "max_steps=1", "--eval-limit", "2",
              "--repeats", "1", "--eval-max-new-tokens", "8", "--base-readouts", "logprob"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    run = subprocess.run([*common, "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["variants"]) == ["correctness", "correctness+crps"] and "skipped" not in summary
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "correctness.tar", "correctness_crps.tar", "forecasts-base-logprob.jsonl",
        "forecasts-correctness-logprob.jsonl", "forecasts-correctness-verbalized.jsonl",
        "forecasts-correctness_crps-logprob.jsonl", "forecasts-correctness_crps-verbalized.jsonl",
        "summary.json", "train-correctness.log", "train-correctness_crps.log"]
    rows = [json.loads(line) for line in open(out / "forecasts-correctness_crps-verbalized.jsonl")]
    assert {r["model_ref"] for r in rows} == {"trained:correctness+crps|verbalized"}

    # The folder as it comes back from the GPU host (no children's folders), with one readout
    # that a deadline cut: run again on a fresh host, that readout is made and nothing trains.
    import shutil

    back = tmp_path / "back"
    back.mkdir()
    for path in out.iterdir():
        if path.is_file():
            shutil.copy2(path, back / path.name)
    (back / "forecasts-correctness_crps-verbalized.jsonl").unlink()
    cut = json.loads((back / "summary.json").read_text())
    cut["variants"]["correctness+crps"]["readouts"] = ["logprob"]
    (back / "summary.json").write_text(json.dumps(cut))
    tar_bytes = (back / "correctness_crps.tar").read_bytes()
    (back / "correctness.tar").unlink()  # done with both readouts: may stay behind to save carry
    run = subprocess.run([*common, "--out", str(back)], capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((back / "summary.json").read_text())
    assert summary["variants"]["correctness+crps"]["readouts"] == ["logprob", "verbalized"]
    assert summary["variants"]["correctness"]["readouts"] == ["logprob", "verbalized"]
    def answers(folder):  # all but the wall time of each forecast
        return [{k: v for k, v in json.loads(line).items() if k != "latency_s"}
                for line in open(folder / "forecasts-correctness_crps-verbalized.jsonl")]

    assert answers(back) == answers(out)  # same adapter, same seed: the same answers
    assert (back / "correctness_crps.tar").read_bytes() == tar_bytes
    child_log = (back / "train-correctness_crps.log").read_text()
    assert "format warm-up" not in child_log and "GRPO" not in child_log, child_log[-1500:]
    assert not (back / "_correctness").exists() and not (back / "correctness.tar").exists()  # no child for it

    late = tmp_path / "late"
    run = subprocess.run([*common, "--out", str(late), "--deadline-s", "0.5"], capture_output=True, text=True,
                         timeout=900, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((late / "summary.json").read_text())
    assert summary["variants"] == {} and sorted(summary["skipped"]) == ["correctness", "correctness+crps"]
    assert not list(late.glob("*.tar"))


@pytest.mark.slow
def test_a_run_cut_by_the_clock_goes_on_in_the_next_call(home, tmp_path):
    """A deadline whose stop time has already passed ends GRPO after its first (checkpointed)
    step: the variant is "unfinished" and nothing is packed. The same command on the same
    folder (the next GPU call, on a warm host) resumes it, finishes, evaluates and merges."""
    from models.tiny import build_tiny_model

    job = tmp_path / "job"
    _invoke("export", "--out", str(job), "--style", "diff", "--profile", "smoke", "--home", str(home), "--gzip")
    tiny = build_tiny_model(tmp_path / "tiny")
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_train_surrogates.py"), "--job", str(job), "--out",
           str(tmp_path / "out"), "--profile", "smoke", "--variants", "correctness", "--parallel",
           "--set", f"base_model={tiny}", "--set", "sft_steps=2", "--set", "max_steps=2", "--eval-limit", "2",
           "--repeats", "1", "--eval-max-new-tokens", "8", "--base-readouts", "logprob"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # stop time = start + 900 - 900: GRPO stops after step 1; the 900 s kill never comes
    run = subprocess.run([*cmd, "--deadline-s", "900", "--stop-margin-s", "900"], capture_output=True, text=True,
                         timeout=900, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"] == {} and summary["unfinished"]["correctness"]["steps"] == 1
    assert not list(out.glob("*.tar")) and (out / "_correctness" / "correctness-ckpt" / "checkpoint-1").is_dir()
    base_file = out / "forecasts-base-logprob.jsonl"
    base_written = base_file.stat().st_mtime_ns

    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert "unfinished" not in summary and summary["variants"]["correctness"]["steps"] == 2
    assert summary["variants"]["correctness"]["readouts"] == ["logprob", "verbalized"]
    assert (out / "correctness.tar").is_file() and (out / "forecasts-correctness-verbalized.jsonl").is_file()
    assert base_file.stat().st_mtime_ns == base_written  # the base forecasts were not made again
    assert not (out / "_correctness" / "correctness-ckpt").exists()  # done: the checkpoints go
    child_log = (out / "train-correctness.log").read_text()
    assert "resuming GRPO from" in child_log and "format warm-up" not in child_log


def test_merge_child_keeps_a_variant_whose_evaluation_a_deadline_cut(tmp_path):
    """A child killed during its verbalized eval still hands over its adapter tar and the
    readouts it finished; a child that trained nothing leaves its variant under "skipped"."""
    import gpu_train_surrogates as gts

    out = tmp_path / "out"
    done, cut, empty = out / "_correctness", out / "_correctness_crps", out / "_correctness_brier"
    for folder in (done, cut, empty):
        folder.mkdir(parents=True)
    (cut / "correctness_crps.tar").write_bytes(b"tar")
    (cut / "forecasts-correctness_crps-logprob.jsonl").write_text("{}\n")
    (cut / "summary.json").write_text(json.dumps({"variants": {"correctness+crps": {"steps": 20, "readouts": ["logprob"]}}}))
    (empty / "summary.json").write_text(json.dumps({"variants": {}}))
    summary: dict = {"variants": {}}
    gts.merge_child(summary, cut, out, "correctness+crps")
    gts.merge_child(summary, empty, out, "correctness+brier")
    gts.merge_child(summary, done / "missing", out, "correctness")  # no summary at all
    assert summary["variants"] == {"correctness+crps": {"steps": 20, "readouts": ["logprob"]}}
    assert summary["skipped"] == ["correctness+brier", "correctness"]
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "correctness_crps.tar", "forecasts-correctness_crps-logprob.jsonl"]


def test_a_gpu_calls_packed_files_unpack_into_one_results_folder(tmp_path):
    """gpu_train_round.sh returns train-rest.tar (train/ without adapters) and one
    train-<variant>.tar per adapter; ingest reads them as one results folder, unpacked once."""
    import tarfile

    train = tmp_path / "host" / "train"
    train.mkdir(parents=True)
    (train / "summary.json").write_text("{}")
    (train / "forecasts-base-logprob.jsonl").write_text("{}\n")
    call = tmp_path / "files_at"
    call.mkdir()
    with tarfile.open(call / "train-rest.tar", "w") as tar:
        tar.add(train, arcname="train")
    (call / "train-correctness.tar").write_bytes(b"adapter")
    folder = surrogate_job._from_gpu_call(call)
    assert folder == tmp_path / "files_at-call" / "train"
    assert sorted(p.name for p in folder.iterdir()) == ["correctness.tar", "forecasts-base-logprob.jsonl", "summary.json"]
    assert surrogate_job._from_gpu_call(call) == folder  # idempotent
    assert surrogate_job._from_gpu_call(folder) == folder  # a plain results folder stays as it is


def test_job_files_plain_or_gzipped_and_a_broken_one_is_one_line(tmp_path):
    import gzip

    import gpu_train_surrogates as gts

    rows = [{"prompt": "p", "true_bin": 3, "pair_id": "a"}]
    with gzip.open(tmp_path / "train.jsonl.gz", "wt") as f:
        f.write(json.dumps(rows[0]) + "\n")
    assert gts.read_jsonl(tmp_path / "train.jsonl") == rows == surrogate_job._job_rows(tmp_path, "train")
    data = (tmp_path / "train.jsonl.gz").read_bytes()
    (tmp_path / "train.jsonl.gz").write_bytes(data[: len(data) // 2])  # truncated in transit
    with pytest.raises(SystemExit, match=r"^error: cannot read .*train\.jsonl\.gz: "):
        gts.read_jsonl(tmp_path / "train.jsonl")
    with pytest.raises(ValueError, match="cannot read"):  # ingest reports it as bad input
        surrogate_job._job_rows(tmp_path, "train")
    (tmp_path / "eval.jsonl").write_text('{"prompt": "p"}\n{"prompt": \n')
    with pytest.raises(SystemExit, match=r"eval\.jsonl:2: not JSON"):
        gts.read_jsonl(tmp_path / "eval.jsonl")
    with pytest.raises(SystemExit, match="cannot read"):
        gts.read_jsonl(tmp_path / "missing.jsonl")


def test_write_whole_leaves_no_half_file(tmp_path):
    import gpu_train_surrogates as gts

    target = tmp_path / "summary.json"
    gts.write_whole(target, lambda p: p.write_text("{}"))

    def dies(p):
        p.write_text('{"half')
        raise KeyboardInterrupt  # a deadline's kill in mid-write

    with pytest.raises(KeyboardInterrupt):
        gts.write_whole(target, dies)
    assert target.read_text() == "{}"


def test_a_results_folder_of_another_job_is_not_resumed(tmp_path):
    """Resuming mixes nothing: a folder whose summary records other settings or another job's
    row counts ends the run with one line before anything is trained or written."""
    import gpu_train_surrogates as gts

    from models.tiny import build_tiny_model

    job = tmp_path / "job"
    job.mkdir()
    row = {"prompt": [{"role": "user", "content": "p"}], "true_bin": 3, "pair_id": "a"}
    for name in ("train", "eval"):
        (job / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    out.mkdir()
    earlier = {"profile": "smoke", "overrides": {"base_model": str(tiny)}, "train_rows": 5, "eval_rows": 1,
               "variants": {}}
    (out / "summary.json").write_text(json.dumps(earlier))
    args = ["--job", str(job), "--out", str(out), "--profile", "smoke", "--variants", "correctness",
            "--set", f"base_model={tiny}", "--skip-base"]
    with pytest.raises(SystemExit, match="holds a run of another job or other settings .*train_rows=5"):
        gts.main(args)
    assert json.loads((out / "summary.json").read_text()) == earlier
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_score_forecasts_made_elsewhere_from_a_results_folder_or_the_saved_parquet(home, tmp_path):
    """`score` joins forecasts to their pairs' true bins without writing to the warehouse: a
    forecast putting all its mass on the true bin scores Brier 0, a uniform one 0.4375, the same
    from the results folder and from the Parquet it saved; bad input is one line."""
    import polars as pl

    from orchestration.settings import load_settings
    from warehouse.db import connect

    cfg = load_settings("smoke", home)
    with connect(cfg.warehouse_path, read_only=True) as con:
        version, = con.execute("SELECT dataset_version FROM dataset_versions ORDER BY created_at DESC LIMIT 1").fetchone()
        pairs = con.execute("SELECT pair_id, true_bin FROM pairs WHERE dataset_version = ? AND split = 'eval' "
                            "ORDER BY pair_id LIMIT 12", [version]).fetchall()
        before = con.execute("SELECT count(*) FROM forecasts").fetchone()[0]
    job, out = tmp_path / "job", tmp_path / "out"
    job.mkdir(), out.mkdir()
    (job / "job.json").write_text(json.dumps({"dataset_version": version}))

    def rows(ref, p_of):
        return "".join(json.dumps({"pair_id": pid, "model_ref": ref, "repeat": 0, "predicted_bin": int(max(range(1, 9), key=lambda b: p_of(y)[b - 1])),
                                   "argmax_bin": int(max(range(1, 9), key=lambda b: p_of(y)[b - 1])), "raw_sum": 1.0, "parse_ok": True,
                                   **{f"p{b}": p_of(y)[b - 1] for b in range(1, 9)}}) + "\n" for pid, y in pairs)

    (out / "forecasts-sure-logprob.jsonl").write_text(rows("trained:sure|logprob", lambda y: [float(b == y) for b in range(1, 9)]))
    (out / "forecasts-base-logprob.jsonl").write_text(rows("base:flat|logprob", lambda y: [0.125] * 8))
    saved = tmp_path / "saved" / "forecasts.parquet"
    table = _invoke("score", str(out), "--job", str(job), "--host", "h200", "--save", str(saved), "--n-boot", "20",
                    "--profile", "smoke", "--home", str(home))
    metrics = json.loads((cfg.reports_dir / f"{version}-scored" / "metrics.json").read_text())
    assert metrics["trained:sure|logprob|h200"]["brier"] == 0.0 and metrics["trained:sure|logprob|h200"]["accuracy"] == 1.0
    assert abs(metrics["base:flat|logprob|h200"]["brier"] - 0.4375) < 1e-12
    assert metrics["base:flat|logprob|h200"]["n"] == len(pairs) == 12
    assert pl.read_parquet(saved).height == 24
    again = _invoke("score", str(saved), "--n-boot", "20", "--profile", "smoke", "--home", str(home))
    assert again.splitlines()[:-1] == table.splitlines()[1:-1]  # same table; the first line said "saved"
    with connect(cfg.warehouse_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM forecasts").fetchone()[0] == before

    # A pair of another dataset version, a version the home lacks: one line each.
    (out / "forecasts-odd-logprob.jsonl").write_text(rows("trained:odd|logprob", lambda y: [0.125] * 8).replace(pairs[0][0], "not-a-pair"))
    unsaved = tmp_path / "unsaved.parquet"
    bad = CliRunner().invoke(surrogate_job.app, ["score", str(out), "--job", str(job), "--save", str(unsaved),
                                                 "--profile", "smoke", "--home", str(home)])
    assert bad.exit_code == 2 and "not pairs of" in " ".join(bad.output.replace("│", " ").split()), bad.output
    assert not unsaved.exists() and not list(tmp_path.glob("unsaved*"))  # nothing saved of a refused set
    # A malformed forecast row (bin 9): the warehouse's own validation, one line.
    (out / "forecasts-odd-logprob.jsonl").write_text(rows("trained:odd|logprob", lambda y: [0.125] * 8).replace(
        '"predicted_bin": 1,', '"predicted_bin": 9,', 1))
    bad = CliRunner().invoke(surrogate_job.app, ["score", str(out), "--job", str(job), "--profile", "smoke", "--home", str(home)])
    assert bad.exit_code == 2 and "Invalid value" in bad.output, bad.output
    (out / "forecasts-odd-logprob.jsonl").unlink()
    (job / "job.json").write_text(json.dumps({"dataset_version": "ds-000000000000"}))
    bad = CliRunner().invoke(surrogate_job.app, ["score", str(out), "--job", str(job), "--profile", "smoke", "--home", str(home)])
    assert bad.exit_code == 2 and "has no pairs in" in " ".join(bad.output.replace("│", " ").split()), bad.output
