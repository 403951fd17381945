"""A registered `code-embed` version as an adapter that forecasts any pair, files included.

`code-embed` (pipelines.surrogates.code_embed) is boosted trees on what the base model read of a
pair's prompt on a GPU host (principal coordinates of its hidden states, the zero-shot label
logits) beside the pair's source-derived feature vector. A version registered with its head
file (models.training.embed_head: the trees, their spreads, the principal axes, the prompt
style, the layers, the feature names) answers:
- a pair its host run holds from its committed forecasts, as `CommittedForecaster` does (the
  same numbers), when the committed run folder is given and holds the variant;
- any other pair by doing here what the host did for the pairs of its run
  (pipelines.forecasting.embed_reader.EmbedReader, the same code a forecaster file runs on a
  GPU host: the prompt, the base model's prefill, the principal coordinates, the feature
  vector, the trees, their Laplace spreads and the version's calibrator).

The base model loads on the first pair that needs it (a few seconds for SmolLM2-135M), so an
adapter that only answers pairs of its run costs nothing more than its committed forecasts.
`forecast_rows` keeps the evaluation's rows what they were: with committed forecasts, the pairs
they hold (a prefill per pair on a CPU for thousands of eval pairs is not what a report should
start silently); without them, every pair.

`EmbedHeadSourcesModel` is the version as an MLflow pyfunc model of kernel sources
(pipelines.forecasting.pyfunc): its head file an artifact, the base model a pip requirement.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.forecasting.base import PairForecaster, check_pairs
from pipelines.forecasting.embed_reader import TOKENS_PER_BATCH, EmbedReader, cpu_reading_dtype
from pipelines.forecasting.pyfunc import BASE_MODEL_REQUIREMENTS, SourcesModel, log_sources_model
from warehouse.bin_edges import P_COLS

__all__ = ["TOKENS_PER_BATCH", "EmbedHeadForecaster", "EmbedHeadSourcesModel", "cpu_reading_dtype", "embed_forecaster",
           "log_embed_head_model"]


class EmbedHeadForecaster(PairForecaster, EmbedReader):
    """A code-embed version: committed forecasts for the pairs of its run, its head for the others.

    Args:
        head, axes, spec: `models.training.embed_head.load_embed_head` of its head file.
        model_ref: what its rows are stored under.
        calibrator: the version's calibrator (tag `calibrator`), applied to the head's forecasts.
        home: KERNELCAST_HOME (where the base model is found or converted).
        committed: the version's `CommittedForecaster` when the committed run folder holds it.
        hardware: hardware_id -> fingerprint for a device the bundle did not know (HardwareTable).
        device: where the base model runs (None: cuda when available, else the CPU).
    """

    kind = "llm"
    needs_kernels = False  # the pairs of its run are answered by kernel ids; the others check their records

    def __init__(self, head: Any, axes: Mapping[str, np.ndarray], spec: Mapping[str, Any], model_ref: str,
                 calibrator: Any = None, home: str | Path | None = None, committed: Any = None,
                 hardware: Any = None, device: str | None = None, source: str = ""):
        EmbedReader.__init__(self, head, axes, spec, calibrator, home, hardware, device)
        self.model_ref, self.committed = model_ref, committed
        self.source = source or f"code-embed head ({self.spec['base_model']} read here)"

    @property
    def variant(self) -> str | None:
        """The committed variant it answers from (the evaluation lists it once, under this version)."""
        return self.committed.variant if self.committed is not None else None

    def forecast_rows(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]] | None = None) -> pl.DataFrame:
        """The evaluation's rows: with committed forecasts, those of the pairs they hold (every
        repeat), as before; without them, every pair read here."""
        if self.committed is not None:
            return self.committed.forecast_rows(pairs, kernels).with_columns(pl.lit(self.model_ref).alias("model_ref"))
        return super().forecast_rows(pairs, kernels or {})

    def _probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        held = self.committed.held_forecasts(pairs) if self.committed is not None else {}
        ids = pairs["pair_id"].to_list()
        out = np.zeros((pairs.height, len(P_COLS)))
        new = [i for i, pid in enumerate(ids) if pid not in held]
        for i, pid in enumerate(ids):
            if pid in held:
                out[i] = held[pid]
        if new:
            check_pairs(pairs[new], kernels)
            out[new] = self.calibrated_probs(pairs[new].to_dicts(), kernels)
        return out

    def head_probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, 8) forecasts of the head before the version's calibrator, every pair read here."""
        check_pairs(pairs, kernels)
        return self.head_probs_of(pairs.to_dicts(), kernels)

    def design(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, width) rows the trees read (EmbedReader.design_of) of a pairs frame."""
        return self.design_of(pairs.to_dicts(), kernels)


def embed_forecaster(tracking_uri: str, name: str, version: int, info: Mapping[str, Any], home: Path,
                     committed: Any, table: Any, device: str | None, model_ref: str, ref: str) -> PairForecaster:
    """The adapter of a registered code-embed version: `EmbedHeadForecaster` when it was
    registered with its head file, else its committed forecasts alone (`committed`), which
    answer only the pairs of its run and say why.

    Raises:
        ValueError: neither is at hand (one line naming why).
    """
    from models.registry.versions import EMBED_HEAD_TAG
    from pipelines.forecasting.llm_shards import version_calibrator

    tags = info.get("tags", {})
    why = ("registered without its head file (its host run's embeddings.parquet carried no principal axes), "
           "it answers only the pairs of its run, from their committed forecasts")
    artifact = tags.get(EMBED_HEAD_TAG)
    if not artifact:
        if committed is None:
            raise ValueError(f"{ref} is a code-embed version {why}, and no committed run folder holding "
                             f"{tags.get('committed_variant')} is in use")
        committed.refusal = f"{ref} is a code-embed version {why}"
        return committed
    import mlflow

    from models.training.embed_head import load_embed_head

    dst = Path(home) / "surrogates" / f"{name}-v{int(version)}-embed-head"
    dst.mkdir(parents=True, exist_ok=True)
    try:
        local = mlflow.artifacts.download_artifacts(run_id=info["run_id"], artifact_path=artifact, dst_path=str(dst),
                                                    tracking_uri=tracking_uri)
    except Exception as exc:  # noqa: BLE001 - MLflow's errors vary by store; the first line is what matters
        raise ValueError(f"{ref}: its head file {artifact} does not download ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    head, axes, spec = load_embed_head(local)
    source = (f"registered code-embed {ref} (version {int(version)}): "
              + ("committed forecasts for the pairs of its run, " if committed is not None else "")
              + f"{spec['base_model']} read here for new pairs")
    return EmbedHeadForecaster(head, axes, spec, model_ref, version_calibrator(tags), home, committed, table, device,
                               source)


# ---- the version as an MLflow pyfunc model of kernel sources ---------------------------------

EMBED_HEAD_ARTIFACT = "embed_head"


class EmbedHeadSourcesModel(SourcesModel):
    """A code-embed version with its head file (artifact `embed_head`): every pair read here, its
    base model resolved under $KERNELCAST_HOME (the embedded SmolLM2 from its pip package)."""

    def adapter(self, artifacts: Mapping[str, str], config: Mapping[str, Any]) -> PairForecaster:
        from models.base_model import kernelcast_home
        from models.training.embed_head import load_embed_head
        from pipelines.forecasting.llm_shards import version_calibrator

        head, axes, spec = load_embed_head(artifacts[EMBED_HEAD_ARTIFACT])
        return EmbedHeadForecaster(head, axes, spec, str(config.get("model_ref") or "pyfunc:code-embed"),
                                   version_calibrator({"calibrator": config.get("calibrator") or "{}"}),
                                   kernelcast_home(), source=f"code-embed head ({spec['base_model']} read here)")


def log_embed_head_model(head_file: str | Path, calibrator: str, base_model: str) -> Any:
    """The pyfunc model of a code-embed version in the active run: its head file and calibrator
    (the version's `calibrator` tag, JSON); the base model a pip requirement, not a copy."""
    from models.training.embed_head import read_head_spec

    spec = read_head_spec(head_file)
    return log_sources_model(EmbedHeadSourcesModel(), {EMBED_HEAD_ARTIFACT: str(head_file)},
                             {"kind": "llm", "calibrator": calibrator, "base_model": spec.get("base_model")},
                             BASE_MODEL_REQUIREMENTS,
                             {"kind": "llm", "finetune": "embed_head", "base_model": base_model,
                              "reads": "kernel sources"})
