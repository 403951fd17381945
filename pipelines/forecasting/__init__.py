"""One forecasting interface: every kind of forecaster behind `forecast_pairs(pairs, kernels)`.

    from pipelines.forecasting import load_forecaster

    f = load_forecaster("models:/kernelcast-surrogate@champion", tracking_uri=uri, home=home,
                        committed_dir=committed, training_pairs=fit_pairs, warehouse_path=wh)
    p = f.forecast_pairs(pairs, kernels)        # (n, 8) numpy, row i for pairs[i]
    rows = f.forecast_rows(pairs, kernels)      # rows for the warehouse `forecasts` table
    f.kind, f.model_ref, f.needs_metadata       # e.g. "cost_model", "models:/kernelcast-surrogate/3", False

`load_forecaster` reads a registered version's `kind` tag once and returns its adapter:
- cost_model / text_model: `ClassicalForecaster` (the model's own calibration);
- llm: `LanguageForecaster` (the registered surrogate, its `calibrator` tag applied), or, when the
  version is tagged `committed_variant` and `committed_dir` holds that variant,
  `CommittedForecaster` (forecasts made on a GPU host; it answers only the pairs it holds:
  `covers(pairs)`, and `forecast_rows` leaves the others out); a code-embed version registered
  with its head file: `EmbedHeadForecaster` (pipelines.forecasting.embed: its committed forecasts
  for the pairs of its run, its base model read here and its trees for any other pair, files
  included);
- "h200:<variant>": a committed variant no version carries;
- "baseline:uniform", "baseline:bin_prior" (needs `training_pairs`), "baseline:oracle" (reads
  the pairs' true_bin);
- "smollm2", "tiny", "base:<spec>" or a checkpoint folder: a base language model; with
  `endpoint=`, an OpenAI-compatible server.

`pairs` is a polars frame with pair_id, anchor_kernel_id, candidate_kernel_id, task,
hardware_id (and true_bin for the oracle); `kernels` maps kernel_id -> kernel record (source,
task, language; generator, algorithm, knobs_json and compile features only when known: no
adapter requires generator metadata). Every adapter gives `answer_pairs` (per pair its
probabilities or why it has none: what `kernelcast forecast` shows). Language-model adapters
also give `forecast_records`
(one `models.forecast.Forecast` per pair, unparsed answers kept with their error) and
`requests(pairs, kernels)` (the prompts, for the sharded GPU run of llm_shards).

How the evaluation calls it (pipelines.forecasting.registered): per registered version of the
dataset version, `f = load_forecaster(models:/name/N, tracking_uri=..., home=..., committed_dir=...)`;
for a `CommittedForecaster`, `f.forecast_rows(eval_pairs)`; for a `LanguageForecaster` forecast
here, `f.requests(eval_subset, records)` are the prompts of its LlmJob (or `f.forecast_rows` in
process); for the others `f.forecast_rows(eval_pairs, records)`; the references likewise with
`training_pairs` = the split's fit pairs. Every adapter is also a search forecaster
(`predict_kernels(anchor, candidates, hardware_id)`), and `file_champion_uri` names the version
that answers kernels from files: @champion-external when the registry has one, else @champion.

Kernel sources instead of records (a search's mutations; every registered version's MLflow
pyfunc model, pipelines.forecasting.pyfunc, answers the same way):

    p = forecast_sources("softmax", anchor_src, [cand1, cand2])     # the file champion, kept loaded
    with open_forecaster("models:/kernelcast-surrogate@champion") as f:
        f.forecast("softmax", anchor_src, batch).p                  # (n, 8); a reader kept warm

What a forecaster may know of a kernel beyond its source is derived from it here too:
`pipelines.forecasting.source_features` (the sm_90 compile with its PTX instruction mix, the
launches and torch ops of one call per benchmark shape on fake tensors, source counts).

No Dagster here; heavy libraries (MLflow, torch, scikit-learn) load only with the adapter
that needs them.
"""

import importlib
from typing import Any

# The names below load on first use: `python3 -m pipelines.forecasting.source_features` runs on a
# bare GPU host (stdlib, numpy, torch, triton, pyarrow), which has no polars for the adapters.
_EXPORTS = {
    "PairForecaster": "base", "single_anchor_pairs": "base",
    "CHAMPION": "load", "CHAMPION_EXTERNAL": "load", "file_champion_uri": "load",
    "load_forecaster": "load", "resolve_version": "load",
    "REFERENCES": "references",
    "SourceForecast": "sources", "SourceForecaster": "sources",
    "forecast_sources": "warm", "open_forecaster": "warm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
