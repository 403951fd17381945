"""One forecasting interface: every kind through `load_forecaster` gives the numbers of the
path it replaces, and `kernelcast forecast` on files refuses what it cannot forecast."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from test_forecasting_models import toy_pairs

from models.classical import CostModel, TextModel
from models.classical.features import side_records
from pipelines.forecasting import CHAMPION_EXTERNAL, file_champion_uri, load_forecaster

P = [f"p{i}" for i in range(1, 9)]


def _pairs_and_kernels(n: int, seed: int) -> tuple[pl.DataFrame, dict, object, np.ndarray]:
    """The toy pairs as (pairs frame, kernel records, pair frame, true bins)."""
    frame, y, _ = toy_pairs(n, seed)
    anchors, cands = side_records(frame, "a"), side_records(frame, "c")
    kernels = {r["kernel_id"]: r for r in anchors + cands}
    pairs = pl.DataFrame({"pair_id": [f"pair-{i}" for i in range(n)], "anchor_kernel_id": [a["kernel_id"] for a in anchors],
                          "candidate_kernel_id": [c["kernel_id"] for c in cands], "task": ["softmax"] * n,
                          "hardware_id": ["nvidia-h200-sm90"] * n, "true_bin": y.tolist()})
    return pairs, kernels, frame, y


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def classical(uri):
    """A registered cost model and text model of the toy rule: {kind: (version, model)}."""
    from models.classical.registry import log_classical

    fit, y, l2 = toy_pairs(200, 0)
    cal, y_cal, _ = toy_pairs(60, 1)
    out = {}
    for kind, model in (("cost_model", CostModel(max_iter=30)), ("text_model", TextModel())):
        model.fit(fit, y, l2)
        model.calibrate(cal, y_cal)
        _, version = log_classical(model, uri, fit.head(4), "kernelcast-surrogate", "ds-test", "in_distribution")
        out[kind] = (version, model)
    return out


@pytest.mark.parametrize("kind", ["cost_model", "text_model"])
def test_a_classical_version_forecasts_as_its_model_does(uri, classical, kind):
    from models.classical.registry import load_classical
    from pipelines.surrogates.classical import forecast_rows

    version, model = classical[kind]
    pairs, kernels, frame, _ = _pairs_and_kernels(30, 3)
    for ref in (f"models:/kernelcast-surrogate/{version}", f"kind:{kind}"):
        f = load_forecaster(ref, tracking_uri=uri)
        assert (f.kind, f.model_ref, f.needs_metadata) == (kind, f"models:/kernelcast-surrogate/{version}", False)
        got = f.forecast_pairs(pairs, kernels)
        assert got.shape == (30, 8) and np.array_equal(got, model.predict_proba(frame))
    # the evaluation's rows of today, number for number
    old = forecast_rows(load_classical(uri, "kernelcast-surrogate", version), pairs, kernels, f.model_ref)
    new = f.forecast_rows(pairs, kernels)
    assert new["pair_id"].to_list() == old["pair_id"].to_list()
    assert np.array_equal(new.select(P).to_numpy(), old.select(P).to_numpy())
    assert new["predicted_bin"].to_list() == old["predicted_bin"].to_list()


def test_the_ensemble_is_the_mean_of_its_members_and_the_prior_and_loads_as_a_classical_version(uri, classical):
    from models.classical.ensemble import EnsembleModel
    from models.classical.registry import log_classical

    fit, y, _ = toy_pairs(200, 0)
    members = [classical["cost_model"][1], classical["text_model"][1]]
    model = EnsembleModel.from_members(members, fit["task"].astype(str).tolist(), y)
    pairs, kernels, frame, _ = _pairs_and_kernels(30, 3)
    prior = (np.bincount(y - 1, minlength=8) + 1.0) / (len(y) + 8)
    want = (members[0].predict_proba(frame) + members[1].predict_proba(frame) + prior) / 3
    assert np.allclose(model.predict_proba(frame), want)
    unseen = frame.assign(task="a_task_never_seen")  # the pooled prior stands in for its own
    assert np.allclose(model.prior_rows(unseen["task"]), prior) and model.member_kinds() == [
        "cost_model", "text_model", "bin_prior"]
    with pytest.raises(TypeError, match="composed"):
        EnsembleModel().fit(fit, y)
    _, version = log_classical(model, uri, fit.head(4), "kernelcast-surrogate", "ds-test", "in_distribution")
    f = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri)
    assert f.kind == "ensemble" and np.allclose(f.forecast_pairs(pairs, kernels), want)


def test_records_without_generator_metadata_are_forecast(uri, classical):
    pairs, kernels, _, _ = _pairs_and_kernels(10, 4)
    bare = {k: {f: v for f, v in r.items() if f not in ("algorithm", "knobs_json", "generator")} for k, r in kernels.items()}
    for kind in ("cost_model", "text_model"):
        p = load_forecaster(f"kind:{kind}", tracking_uri=uri).forecast_pairs(pairs, bare)
        assert p.shape == (10, 8) and np.allclose(p.sum(axis=1), 1)


def test_the_search_hook_is_the_same_forecast(uri, classical):
    version, model = classical["cost_model"]
    pairs, kernels, frame, _ = _pairs_and_kernels(8, 5)
    f = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri)
    anchor = kernels[pairs["anchor_kernel_id"][0]]
    cands = [kernels[c] for c in pairs["candidate_kernel_id"]]
    assert np.array_equal(f.predict_kernels(anchor, cands, "h"), model.predict_kernels(anchor, cands, "h"))


def test_references_are_the_baselines(classical):
    from models import baselines
    from models.bins import BIN_LOG2_VALUES, speedups_to_bins

    pairs, _, _, _ = _pairs_and_kernels(12, 6)
    speedups = 2.0 ** np.array([*BIN_LOG2_VALUES, *BIN_LOG2_VALUES[:4]])  # every bin
    speed = pairs.drop("true_bin").with_columns(pl.Series("speedup", speedups))  # what the baselines read
    pairs = pairs.with_columns(pl.Series("true_bin", speedups_to_bins(speedups)))
    training = pl.DataFrame({"task": ["softmax"] * 5 + ["rmsnorm"] * 3, "true_bin": [1, 2, 2, 8, 5, 3, 3, 3]})
    expect = {"baseline:uniform": baselines.uniform_forecasts(speed),
              "baseline:bin_prior": baselines.bin_prior_forecasts(speed, training),
              "baseline:oracle": baselines.oracle_forecasts(speed)}
    for ref, old in expect.items():
        f = load_forecaster(ref, training_pairs=training)
        assert f.kind == "baseline" and f.model_ref == ref and f.needs_metadata is False
        assert np.array_equal(f.forecast_pairs(pairs, {}), old.select(P).to_numpy()), ref
    assert len(set(pairs["true_bin"].to_list())) == 8  # the oracle is checked on every bin
    assert np.array_equal(load_forecaster("baseline:oracle").forecast_pairs(speed, {}),
                          expect["baseline:oracle"].select(P).to_numpy())  # from the speedup alone too
    with pytest.raises(ValueError, match="training pairs"):
        load_forecaster("baseline:bin_prior")
    with pytest.raises(ValueError, match="true_bin"):
        load_forecaster("baseline:oracle").forecast_pairs(pairs.drop("true_bin"), {})
    with pytest.raises(ValueError, match="unknown reference"):
        load_forecaster("baseline:median")


def _committed_run(folder, pairs: pl.DataFrame, y: np.ndarray) -> None:
    """A committed run folder of one variant: raw forecasts of calibration and eval pairs."""
    rng = np.random.default_rng(0)
    rows = []
    for role in ("calibration", "eval"):
        for r, b in zip(pairs.iter_rows(named=True), y, strict=True):
            p = rng.dirichlet(np.ones(8)) * 0.5
            p[b - 1] += 0.5
            rows.append({"variant": "lora", "role": role, "readout": "logprob", "pair_id": f"old-{r['pair_id']}",
                         "hardware_id": r["hardware_id"], "anchor_kernel_id": r["anchor_kernel_id"],
                         "candidate_kernel_id": r["candidate_kernel_id"], "repeat": 0, "parse_ok": True,
                         "true_bin": int(b), **{c: float(v) for c, v in zip(P, p, strict=True)}})
    folder.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(folder / "forecasts.parquet")
    (folder / "training.json").write_text(json.dumps({"variants": {"lora": {"settings": {"style": "compact"}}}}))


def test_committed_forecasts_answer_the_pairs_they_hold(tmp_path, uri):
    from models.registry.versions import set_version_tag
    from pipelines.surrogates.committed import calibrated_variants

    pairs, kernels, _, y = _pairs_and_kernels(10, 7)
    _committed_run(tmp_path / "run", pairs.head(8), y[:8])
    (old,) = calibrated_variants(tmp_path / "run", pairs, pairs.head(0))
    f = load_forecaster("h200:lora", committed_dir=tmp_path / "run")
    assert (f.kind, f.model_ref) == ("llm", "h200:lora")
    assert np.array_equal(f.forecast_pairs(pairs.head(8), {}), old.forecasts.sort("pair_id").select(P).to_numpy()
                          [np.argsort(np.argsort(pairs.head(8)["pair_id"].to_list()))])
    rows = f.forecast_rows(pairs, {})
    assert rows.height == 8 and set(rows["model_ref"]) == {"h200:lora"}
    with pytest.raises(ValueError, match="holds no forecast of 2 of the 10 pairs"):
        f.forecast_pairs(pairs, {})
    with pytest.raises(ValueError, match="no committed variant 'full'"):
        load_forecaster("h200:full", committed_dir=tmp_path / "run")
    # A registered LLM version carrying the variant answers from the committed forecasts.
    version = _register_llm_version(uri, tmp_path)
    set_version_tag(uri, version, "committed_variant", "lora")
    g = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri, committed_dir=tmp_path / "run")
    assert g.model_ref == f"models:/kernelcast-surrogate/{version}"
    assert np.array_equal(g.forecast_pairs(pairs.head(8), {}), f.forecast_pairs(pairs.head(8), {}))


def _register_llm_version(uri: str, tmp_path, calibrator: dict | None = None) -> int:
    """A registered LLM surrogate: a LoRA adapter with non-zero B on the tiny model."""
    import torch
    from mlflow import MlflowClient
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.registry.tracking import mlflow_experiment
    from models.registry.versions import register_surrogate
    from models.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    model.save_pretrained(str(tmp_path / "adapter"))
    PreTrainedTokenizerFast.from_pretrained(str(tiny)).save_pretrained(str(tmp_path / "adapter"))
    client = MlflowClient(uri)
    run = client.create_run(mlflow_experiment(client, uri, "kernelcast-training"))
    client.set_terminated(run.info.run_id)
    tags = {"calibrator": json.dumps(calibrator)} if calibrator else {}
    return register_surrogate(uri, run.info.run_id, tmp_path / "adapter", base_model=str(tiny), dataset_version="ds-test",
                              tags=tags, prompt_style="compact")


def test_file_champion_prefers_the_external_alias(uri, classical):
    from mlflow import MlflowClient

    from models.registry.versions import set_alias

    cost, text = classical["cost_model"][0], classical["text_model"][0]
    set_alias(uri, "champion", cost)
    assert file_champion_uri(uri) == "models:/kernelcast-surrogate@champion"
    MlflowClient(uri, registry_uri=uri).set_registered_model_alias("kernelcast-surrogate", CHAMPION_EXTERNAL, str(text))
    assert file_champion_uri(uri) == f"models:/kernelcast-surrogate@{CHAMPION_EXTERNAL}"
    assert load_forecaster(file_champion_uri(uri), tracking_uri=uri).kind == "text_model"
    assert file_champion_uri(None) is None


@pytest.mark.slow
def test_a_registered_llm_forecasts_as_the_evaluation_and_the_old_command_did(tmp_path):
    """Same prompts (the training row builder's), same calibrator, same numbers."""
    from models.backends import ForecastRequest
    from models.calibration import Calibrator
    from models.registry.lifecycle import registered_forecaster
    from models.training.rows import build_training_rows
    from pipelines.forecasting.llm_shards import LlmJob, _calibrated_rows
    from pipelines.tasks import get_task, prompt_source

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cal = {"temperature": 1.7, "bias": [0.3, -0.2, 0.0, 0.1, 0.0, 0.0, -0.1, 0.2], "objective": "nll", "n_fit": 9}
    version = _register_llm_version(uri, tmp_path, cal)
    pairs, kernels, _, _ = _pairs_and_kernels(3, 8)
    f = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=uri, home=tmp_path / "home", cache=False)
    assert (f.kind, f.model_ref, f.style) == ("llm", f"models:/kernelcast-surrogate/{version}", "compact")
    task = get_task("softmax")
    shown = {k: prompt_source("softmax", r["source"], r["generator"]) for k, r in kernels.items()}  # the row builder's
    rows = build_training_rows(pairs, shown,
                               {"softmax": {"description": task.description,
                                            "benchmark_cases": [dict(c) for c in task.benchmark_cases]}},
                               {"nvidia-h200-sm90": f.hardware("nvidia-h200-sm90")}, style="compact")
    assert [r["prompt"] for r in f.requests(pairs, kernels)] == [r["prompt"] for r in rows]
    backend, _ = registered_forecaster(uri, version, tmp_path / "home")
    answers = backend.forecast([ForecastRequest(r["prompt"], r["pair_id"]) for r in rows])
    old = _calibrated_rows(LlmJob("m", "compact", tuple(rows), calibrator=cal), answers)
    new = f.forecast_rows(pairs, kernels)
    assert np.allclose(new.select(P).to_numpy(), old.select(P).to_numpy(), atol=1e-12)
    assert new["parse_ok"].to_list() == old["parse_ok"].to_list()
    assert np.allclose(f.forecast_pairs(pairs, kernels), old.select(P).to_numpy(), atol=1e-12)
    records = f.forecast_records(pairs, kernels)
    want = Calibrator.from_dict(cal).apply([list(a.p) for a in answers])
    assert all(r.parse_ok for r in records)
    assert np.allclose([r.p for r in records], want, atol=1e-12)
    # what `kernelcast forecast` shows per candidate: the same numbers; a prompt over the context
    # is that pair's row (or, strict, the error)
    assert np.allclose([p for p, _ in f.answer_pairs(pairs, kernels)], want, atol=1e-12)
    too_long = rows[1]["prompt"]

    def fits(prompt):
        if prompt == too_long:
            raise ValueError("the prompt needs 9000 tokens; the model holds 8192")

    f.fits = fits
    got = f.answer_pairs(pairs, kernels)
    assert got[1] == (None, "the prompt needs 9000 tokens; the model holds 8192")
    assert np.allclose([got[0][0], got[2][0]], [want[0], want[2]], atol=1e-12) and got[0][1] is None
    with pytest.raises(ValueError, match="needs 9000 tokens"):
        f.answer_pairs(pairs, kernels, strict=True)


# ---- kernelcast forecast on files ---------------------------------------------------------

SOFTMAX_PYTORCH = ("import torch\n\n\ndef custom_kernel(data):\n    (x,) = data\n"
                   "    return torch.softmax(x.float(), dim=-1).to(torch.bfloat16)\n")


@pytest.fixture
def cli_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCAST_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _invoke(*args: str):
    from typer.testing import CliRunner

    from orchestration.cli import app

    return CliRunner().invoke(app, ["forecast", *args])


def _kernel_files(folder):
    from pipelines.generation import registry

    folder.mkdir(parents=True, exist_ok=True)
    files = {"softmax_triton.py": registry.render_point(registry.seed_point("softmax")),
             "softmax_torch.py": SOFTMAX_PYTORCH,
             "rms_norm.py": registry.render_point(registry.seed_point("rms_norm")),
             "no_entry.py": "import torch\n\n\ndef kernel(data):\n    return data\n",
             "broken.py": "def custom_kernel(data)\n    return data\n"}
    for name, text in files.items():
        (folder / name).write_text(text)
    return {name: folder / name for name in files}


@pytest.mark.parametrize("name, flags, exit_code, words", [
    ("no_entry.py", (), 2, "defines no custom_kernel(data)"),
    ("broken.py", (), 2, "syntax error at line 1"),
    # another task's kernel: its launcher cannot take the task's input, so nothing compiles
    ("rms_norm.py", (), 2, "the sm_90 compile on the task's benchmark input failed: ValueError"),
    ("rms_norm.py", ("--check",), 2, "raises on the task's correctness input on Triton's CPU interpreter, which may "
                                     "be at fault rather than the kernel"),
])
def test_a_file_that_is_no_kernel_of_the_task_is_refused_in_one_line(tmp_path, cli_home, name, flags, exit_code,
                                                                     words):
    files = _kernel_files(tmp_path / "k")
    res = _invoke("--task", "softmax", "--anchor", str(files["softmax_torch.py"]), "--candidate", str(files[name]),
                  "--model", "baseline:uniform", "--json", *flags)
    assert res.exit_code == exit_code
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {files[name]}: ") and words in lines[0], res.output


def test_when_every_file_is_needed_a_refusal_ends_the_reading_at_its_stage(tmp_path):
    """One anchor and one candidate: a candidate refused by the static reading leaves the
    anchor unchecked (no record, no refusal), one refused by its check stops the compiles."""
    from pipelines.forecasting.files import read_kernel_files

    files = _kernel_files(tmp_path / "k")
    anchor, broken = read_kernel_files("softmax", [files["softmax_torch.py"], files["broken.py"]], all_needed=True)
    assert broken.refused.startswith("syntax error at line 1") and anchor.refused is None and anchor.record is None
    anchor, triton = read_kernel_files("softmax", [files["rms_norm.py"], files["softmax_triton.py"]], all_needed=True,
                                       check=True)
    assert anchor.refused.startswith("raises on the task's correctness input on Triton's CPU interpreter")
    assert triton.refused is None and triton.record is None  # checked, never compiled
    # without it, the other file is read to the end
    anchor, broken = read_kernel_files("softmax", [files["softmax_torch.py"], files["broken.py"]], check=False,
                                      compile=False)
    assert anchor.record is not None and broken.record is None


def test_a_source_given_twice_is_checked_compiled_and_traced_once(tmp_path):
    from pipelines.forecasting.files import _once_per_source

    calls = []
    got = _once_per_source([0, 2, 3, 5], {0: "a", 2: "b", 3: "a", 5: "c"}, lambda first: calls.append(first) or
                           [f"r{i}" for i in first])
    assert calls == [[0, 2, 5]] and got == ["r0", "r2", "r0", "r5"]
    from pipelines.forecasting.files import read_kernel_files

    files = _kernel_files(tmp_path / "k")
    copy = tmp_path / "copy.py"
    copy.write_text(files["softmax_torch.py"].read_text())
    a, b = read_kernel_files("softmax", [files["softmax_torch.py"], copy], check=False)
    assert a.record["kernel_id"] != b.record["kernel_id"] and not a.notes and len(a.record) > 20
    assert {**a.record, "kernel_id": None} == {**b.record, "kernel_id": None}


def test_a_triton_file_is_compiled_once_and_one_that_reads_values_on_the_host_falls_back(tmp_path, monkeypatch):
    """The source-features child's compile serves a Triton file that compiles; a file whose call
    reads a value on the host (which fake tensors cannot give) is compiled by the generator's
    compile on a real input instead, as a generated kernel would be, and keeps its compile
    features with a note."""
    import pipelines.generation.aot as aot
    from pipelines.forecasting.files import read_kernel_files

    files = _kernel_files(tmp_path / "k")
    host = tmp_path / "reads_on_host.py"
    host.write_text(files["softmax_triton.py"].read_text() + (
        "\n\n_on_device = custom_kernel\n\n\ndef custom_kernel(data):\n"
        "    if not float(data[0].float().abs().max()) >= 0.0:  # a value read on the host\n"
        "        raise ValueError('nan in the input')\n"
        "    return _on_device(data)\n"))
    compiled = []
    real = aot.compile_many
    monkeypatch.setattr(aot, "compile_many", lambda records, **kw: compiled.extend(records) or real(records, **kw))
    plain, on_host = read_kernel_files("softmax", [files["softmax_triton.py"], host], check=False)
    assert [r["kernel_id"] for r in compiled] == [str(host)]  # the plain file needed no second compile
    assert plain.refused is None and not plain.notes
    assert plain.record["n_regs"] > 0 and plain.record["ptx_ld_global"] > 0 and plain.record["trace_cases"] > 0
    assert on_host.refused is None and on_host.record["n_regs"] == plain.record["n_regs"]
    assert len(on_host.notes) == 1 and on_host.notes[0].startswith("no source features:")


def test_a_triton_file_that_hangs_is_refused_after_one_child(tmp_path, monkeypatch):
    """A file whose call never returns times out in the source-features child and is refused in
    one line there; the generator's compile, which would hang as long again, is not asked."""
    import pipelines.generation.aot as aot
    from pipelines.forecasting.files import read_kernel_files

    files = _kernel_files(tmp_path / "k")
    hang = tmp_path / "hangs.py"
    hang.write_text(files["softmax_triton.py"].read_text() + (
        "\n\n_on_device = custom_kernel\n\n\ndef custom_kernel(data):\n"
        "    while True:\n        pass\n"))
    monkeypatch.setattr(aot, "compile_many", lambda records, **kw: pytest.fail("asked the generator's compile"))
    (f,) = read_kernel_files("softmax", [hang], check=False, compile_timeout_s=3.0)
    assert f.record is None and f.refused == "the sm_90 compile on the task's benchmark input failed: timeout after 3 s"


def test_an_unknown_task_and_a_refused_anchor_are_one_line(tmp_path, cli_home):
    files = _kernel_files(tmp_path / "k")
    res = _invoke("--task", "softmaxx", "--anchor", str(files["softmax_torch.py"]), "--candidate",
                  str(files["softmax_torch.py"]), "--model", "baseline:uniform")
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "softmaxx" in res.output
    res = _invoke("--task", "softmax", "--anchor", str(files["no_entry.py"]), "--candidate",
                  str(files["softmax_torch.py"]), "--model", "baseline:uniform")
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        f"error: anchor {files['no_entry.py']}: defines no custom_kernel(data): not a kernel module"]


@pytest.mark.slow
def test_several_candidates_and_a_folder_one_row_each_with_the_registered_cost_model(tmp_path, cli_home):
    """A folder of five files against one anchor: three rows refused with their reason, two
    forecast by @champion (a cost model) from the files' own records, exit 1 at the end."""
    from models.classical.registry import log_classical
    from models.registry.versions import set_alias
    from orchestration.settings import load_settings
    from pipelines.forecasting.files import read_kernel_files

    settings = load_settings()
    fit, y, l2 = toy_pairs(200, 0)
    _, version = log_classical(CostModel(max_iter=30).fit(fit, y, l2), settings.mlflow_uri, fit.head(4),
                               "kernelcast-surrogate", "ds-test", "in_distribution")
    set_alias(settings.mlflow_uri, "champion", version)
    files = _kernel_files(tmp_path / "k")
    anchor = files["softmax_torch.py"]
    res = _invoke("--task", "softmax", "--anchor", str(anchor), "--candidate", str(tmp_path / "k"), "--json")
    assert res.exit_code == 1, res.output
    rows = json.loads(res.stdout)
    assert isinstance(rows, list) and [r["file"] for r in rows] == [str(p) for p in sorted(files.values())]
    by = {r["file"].rsplit("/", 1)[-1]: r for r in rows}
    assert {n for n, r in by.items() if r["ok"]} == {"softmax_triton.py", "softmax_torch.py"}
    assert "syntax error" in by["broken.py"]["refused"] and "custom_kernel" in by["no_entry.py"]["refused"]
    assert by["rms_norm.py"]["refused"].startswith("the sm_90 compile on the task's benchmark input failed")
    assert {r["model_ref"] for r in rows} == {f"models:/kernelcast-surrogate/{version}"}
    assert {r["kind"] for r in rows} == {"cost_model"}
    # the numbers are the interface's on the files' records: no generator, the compile features
    recs = read_kernel_files("softmax", [anchor, files["softmax_triton.py"]])
    a, c = recs[0].record, recs[1].record
    assert c["generator"] is None and c["algorithm"] is None and c["knobs_json"] is None
    assert c["language"] == "triton" and isinstance(c["n_regs"], int) and c["n_launches"] >= 1
    f = load_forecaster(f"models:/kernelcast-surrogate/{version}", tracking_uri=settings.mlflow_uri)
    want = f.predict_kernels(a, [c], "nvidia-h200-sm90")[0]
    got = by["softmax_triton.py"]
    assert np.allclose(got["p"], want, atol=1e-12) and got["predicted_bin"] == int(np.argmax(want)) + 1
    assert got["p_bin"] == pytest.approx(max(want)) and abs(sum(got["p"]) - 1) < 1e-9
    # the table: a header and one line per candidate, each refusal with its reason
    table = _invoke("--task", "softmax", "--anchor", str(anchor), "--candidate", str(files["softmax_torch.py"]),
                    str(files["no_entry.py"]), "--no-check")
    assert table.exit_code == 1
    out = table.stdout.strip().splitlines()
    assert out[0].split()[:4] == ["file", "bin", "p(bin)", "E[log2"] and len(out) == 3
    assert "refused: defines no custom_kernel" in out[2]
    # within a 100-column terminal (the file column gives way, the bin's name stays out); a wide
    # one names the bin
    from models.bins import BIN_NAMES

    for columns, named in ((100, False), (160, True)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("COLUMNS", str(columns))
            lines = _invoke("--task", "softmax", "--anchor", str(anchor), "--candidate",
                            str(files["softmax_triton.py"]), "--no-check").stdout.strip().splitlines()
        assert all(len(line) <= columns for line in lines), lines
        assert any(name in lines[1] for name in BIN_NAMES) is named and ("bin name" in lines[0]) is named


def test_the_search_and_autotune_hooks_answer_from_the_file_champion(tmp_path):
    """'champion' in the search and the autotune hook's default: @champion-external when the
    registry has it, else @champion; an LLM version is refused before its weights load."""
    from mlflow import MlflowClient

    from models.classical.registry import log_classical
    from models.registry.versions import set_alias
    from pipelines.search.autotune import registered_autotune_forecaster
    from pipelines.search.forecasters import ForecasterContext, resolve_forecaster
    from pipelines.search.registered import register_search_forecasters

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    register_search_forecasters()
    ctx = ForecasterContext(tracking_uri=uri, home=tmp_path)
    with pytest.raises(ValueError, match="no registered @champion-external or @champion"):
        resolve_forecaster("champion", ctx)
    fit, y, l2 = toy_pairs(200, 0)
    models = {}
    for kind, model in (("cost_model", CostModel(max_iter=30)), ("text_model", TextModel())):
        _, models[kind] = log_classical(model.fit(fit, y, l2), uri, fit.head(4), "kernelcast-surrogate", "ds", "in_distribution")
    set_alias(uri, "champion", models["cost_model"])
    assert resolve_forecaster("champion", ctx).kind == "cost_model"
    assert registered_autotune_forecaster(uri, tmp_path).kind == "cost_model"
    MlflowClient(uri, registry_uri=uri).set_registered_model_alias("kernelcast-surrogate", CHAMPION_EXTERNAL,
                                                                  str(models["text_model"]))
    f = resolve_forecaster("champion", ctx)
    assert f.kind == "text_model" and f.model_ref == f"models:/kernelcast-surrogate/{models['text_model']}"
    pairs, kernels, frame, _ = _pairs_and_kernels(5, 9)
    anchor, cands = kernels[pairs["anchor_kernel_id"][0]], [kernels[c] for c in pairs["candidate_kernel_id"]]
    assert registered_autotune_forecaster(uri, tmp_path).kind == "text_model"
    assert np.array_equal(f.predict_kernels(anchor, cands, "h"), f.model.predict_kernels(anchor, cands, "h"))
    llm = _register_llm_version(uri, tmp_path)
    with pytest.raises(ValueError, match=f"models:/kernelcast-surrogate/{llm} is a llm version; the simulation"):
        resolve_forecaster(f"models:/kernelcast-surrogate/{llm}", ctx)
    assert not (tmp_path / "surrogates").exists()  # refused before anything was downloaded


def test_a_base_model_forecasts_as_the_old_command_did(tmp_path):
    from models.service import DEFAULT_HARDWARE, forecast_pair
    from models.tiny import build_tiny_model
    from pipelines.generation import registry
    from pipelines.tasks import get_task

    tiny = build_tiny_model(tmp_path / "tiny")
    a = {"kernel_id": "a", "task": "softmax", "source": SOFTMAX_PYTORCH, "language": "pytorch"}
    c = {"kernel_id": "c", "task": "softmax", "source": registry.render_point(registry.seed_point("softmax")),
         "language": "triton"}
    f = load_forecaster(str(tiny), home=tmp_path / "home", cache=False)
    assert (f.kind, f.style, f.needs_metadata) == ("llm", "diff", False)
    pairs = pl.DataFrame({"pair_id": ["p"], "anchor_kernel_id": ["a"], "candidate_kernel_id": ["c"],
                          "task": ["softmax"], "hardware_id": ["nvidia-h200-sm90"]})
    (got,) = f.forecast_records(pairs, {"a": a, "c": c})
    t = get_task("softmax")
    old, ref = forecast_pair("softmax", t.description, a["source"], c["source"], DEFAULT_HARDWARE, tiny, style="diff")
    assert got.parse_ok and np.allclose(got.p, old.p, atol=1e-12) and f.model_ref == ref
    assert np.allclose(f.forecast_pairs(pairs, {"a": a, "c": c})[0], old.p, atol=1e-12)


def test_the_context_check_examples_hold():
    import doctest

    import pipelines.forecasting.context as context

    result = doctest.testmod(context, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0


def test_the_source_forecaster_is_a_pair_forecaster_of_its_adapter():
    """Pairs of kernel records go through a SourceForecaster to its adapter as they are: the
    adapter's numbers, its kind and model_ref, and no reader child started for them."""
    from pipelines.forecasting.base import PairForecaster, single_anchor_pairs
    from pipelines.forecasting.references import BinPriorForecaster
    from pipelines.forecasting.sources import SourceForecaster

    adapter = BinPriorForecaster.from_pairs(pl.DataFrame({"task": ["softmax", "softmax", "rms_norm"],
                                                          "speedup": [1.2, 3.0, 0.4]}))
    anchor = {"kernel_id": "a", "task": "softmax"}
    cands = [{"kernel_id": "c1", "task": "softmax"}, {"kernel_id": "c2", "task": "rms_norm"}]
    pairs, kernels = single_anchor_pairs(anchor, cands, "h")
    with SourceForecaster(adapter, n_workers=1) as f:
        assert isinstance(f, PairForecaster) and (f.kind, f.model_ref) == ("baseline", "baseline:bin_prior")
        np.testing.assert_array_equal(f.forecast_pairs(pairs, kernels), adapter.forecast_pairs(pairs, kernels))
        np.testing.assert_array_equal(f.predict_kernels(anchor, cands, "h"), adapter.predict_kernels(anchor, cands, "h"))
        assert f.answer_pairs(pairs, kernels) == adapter.answer_pairs(pairs, kernels)
        assert f.pool.running == 0
