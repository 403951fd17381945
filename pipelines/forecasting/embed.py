"""A registered `code-embed` version as an adapter that forecasts any pair, files included.

`code-embed` (pipelines.surrogates.code_embed) is boosted trees on what the base model read of a
pair's prompt on a GPU host (principal coordinates of its hidden states, the zero-shot label
logits) beside the pair's source-derived feature vector. A version registered with its head
file (models.training.embed_head: the trees, their spreads, the principal axes, the prompt
style, the layers, the feature names) answers:
- a pair its host run holds from its committed forecasts, as `CommittedForecaster` does (the
  same numbers), when the committed run folder is given and holds the variant;
- any other pair by doing here what the host did for the pairs of the run: the same prompt from
  the two sources (models.training.gpu_host.job.training_rows, the job's task and hardware
  tables kept with the head), the base model's prefill over it on this machine (the same
  layers, the weights in bfloat16 as the host's where the CPU computes in it natively,
  `cpu_reading_dtype`; on a CPU models.training.head.embed_prompts_shared, which prefills what
  the prompts share, the anchor's half of every pair of one anchor, once: the numbers of a full
  prefill of each prompt up to round-off, in about half the tokens), its coordinates on the stored axes
  (`project`), the feature vector the job would have given
  (pipelines.surrogates.code_bundle.named_feature_vectors), then the trees, their Laplace spreads
  and the version's calibrator.

The base model loads on the first pair that needs it (a few seconds for SmolLM2-135M), so an
adapter that only answers pairs of its run costs nothing more than its committed forecasts.
`forecast_rows` keeps the evaluation's rows what they were: with committed forecasts, the pairs
they hold (a prefill per pair on a CPU for thousands of eval pairs is not what a report should
start silently); without them, every pair.

`EmbedHeadSourcesModel` is the version as an MLflow pyfunc model of kernel sources
(pipelines.forecasting.pyfunc): its head file an artifact, the base model a pip requirement.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.forecasting.base import PairForecaster, check_pairs
from pipelines.forecasting.pyfunc import BASE_MODEL_REQUIREMENTS, SourcesModel, log_sources_model
from warehouse.bin_edges import P_COLS

TOKENS_PER_BATCH = 8192  # a prefill batch on a CPU: a few hundred MB of hidden states at most


class EmbedHeadForecaster(PairForecaster):
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
        from pipelines.forecasting.language import HardwareTable

        self.head, self.axes, self.spec = head, dict(axes), dict(spec)
        self.model_ref, self.calibrator, self.home, self.committed = model_ref, calibrator, home, committed
        self.hardware, self.device = hardware or HardwareTable(), device
        self.style = self.spec["style"]
        self.parts, self.k = tuple(self.spec["parts"]), int(self.spec["components"])
        self.source = source or f"code-embed head ({self.spec['base_model']} read here)"
        self._base: tuple[Any, Any] | None = None
        self.seconds: dict[str, float] = {}  # what the last new pairs took: load, prefill, the rest

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
            p = self.head_probs(pairs[new], kernels)
            out[new] = p if self.calibrator is None else self.calibrator.apply(p)
        return out

    def head_probs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, 8) forecasts of the head before the version's calibrator, every pair read here."""
        check_pairs(pairs, kernels)
        return self.head.predict_proba(self.design(pairs, kernels), pairs["task"].to_list())

    def design(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, width) rows the trees read: the features, the first k coordinates, the zero-shot
        logits, as pipelines.surrogates.code_embed.design lays them out for the pairs of a run."""
        from pipelines.surrogates.code_bundle import named_feature_vectors
        from pipelines.surrogates.code_embed import design

        t0 = time.time()
        rows = pairs.to_dicts()
        keys = [f"pair-{i}" for i in range(len(rows))]  # a frame may hold one pair id twice
        feats = (named_feature_vectors(self.spec["feature_names"], pairs, kernels) if "features" in self.parts
                 else [[] for _ in rows])
        # The job stores the feature vector as float32: the trees were fitted on those values.
        items = [{"pair_id": key, "features": np.asarray(f, dtype=np.float32).tolist()} for key, f in zip(keys, feats, strict=True)]
        embedded: dict[str, dict[str, list[float]]] = {}
        if {"pc", "zero_shot"} & set(self.parts):
            pc, zero_shot = self.reading(rows, kernels)
            embedded = {key: {"pc": pc[i].tolist(), "zero_shot": zero_shot[i].tolist()} for i, key in enumerate(keys)}
        x = design(items, embedded, self.parts, self.k)
        self.seconds["total"] = round(time.time() - t0, 3)
        return x

    def reading(self, rows: list[dict[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """((n, k) principal coordinates, (n, 8) zero-shot logits), float32 as embeddings.parquet
        holds them: the base model's prefill over each pair's prompt, as the host ran it."""
        from models.training.gpu_host.llm_code import fast_encode
        from models.training.head import (
            embed_prompts,
            embed_prompts_shared,
            prefix_tree,
            project,
            truncate_middle,
        )

        model, tokenizer = self._base_model()
        t0 = time.time()
        prompts = self.prompts(rows, kernels)
        limit = int(getattr(model.config, "max_position_embeddings", 8192) or 8192) - 1
        ids, labels = fast_encode(tokenizer, prompts)
        ids = [truncate_middle(i, limit) for i in ids]
        self.seconds["tokens"] = float(sum(len(i) for i in ids))
        if next(model.parameters()).device.type == "cuda":  # the host's way: padded batches in bfloat16
            emb = embed_prompts(model, tokenizer, ids, labels, self.spec["layers"], TOKENS_PER_BATCH, autocast=True)
            self.seconds["tokens_read"] = self.seconds["tokens"]
        else:  # what the pairs share (the anchor's half of each prompt) prefilled once
            tree = prefix_tree(ids)
            emb = embed_prompts_shared(model, ids, labels, self.spec["layers"], tree=tree)
            self.seconds["tokens_read"] = float(sum(end - start for _, start, end, _, _ in tree))
        self.seconds["prefill"] = round(time.time() - t0, 3)
        hidden, zero_shot = emb[:, :-8], emb[:, -8:]
        if hidden.shape[1] != self.axes["mean"].shape[0]:
            raise ValueError(f"{self.spec['base_model']} with layers {self.spec['layers']} reads {hidden.shape[1]} numbers "
                             f"a pair, the head's axes {self.axes['mean'].shape[0]}: not the model it was fitted on")
        return project(hidden, self.axes), zero_shot.astype(np.float32)

    def prompts(self, rows: list[dict[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The host's training rows (prompt) of the pairs, from the kernel records: the code the
        model reads of each side (the reference's PyTorch body for a reference), its compile
        features, the bundle's task description and hardware fingerprint where it had them."""
        from models.training.gpu_host.job import training_rows
        from pipelines.forecasting.language import record_features
        from pipelines.tasks import get_task, prompt_source

        tasks, hardware = dict(self.spec.get("tasks") or {}), dict(self.spec.get("hardware") or {})
        sides: dict[str, dict[str, Any]] = {}
        pairs = []
        for i, r in enumerate(rows):
            if r["task"] not in tasks:
                task = get_task(r["task"])
                tasks[r["task"]] = {"description": task.description,
                                    "benchmark_cases": [dict(c) for c in task.benchmark_cases]}
            if r["hardware_id"] not in hardware:
                hardware[r["hardware_id"]] = self.hardware(r["hardware_id"])
            for side in ("anchor", "candidate"):
                rec = kernels[r[f"{side}_kernel_id"]]
                sides[f"{i}:{side}"] = {"prompt_source": prompt_source(r["task"], rec.get("source") or "", rec.get("generator")),
                                        "features": record_features(rec)}
            pairs.append({"pair_id": f"pair-{i}", "task": r["task"], "hardware_id": r["hardware_id"],
                          "anchor_kernel_id": f"{i}:anchor", "candidate_kernel_id": f"{i}:candidate", "true_bin": 0})
        return training_rows({"tasks": tasks, "hardware": hardware}, sides, pairs, self.style)

    def _base_model(self) -> tuple[Any, Any]:
        """The base model and tokenizer, once: bfloat16 on a GPU, as the host loaded it; on a
        CPU `cpu_reading_dtype()`."""
        if self._base is None:
            import torch

            from models.backends.transformers_backend import load_model_and_tokenizer
            from models.base_model import resolve_base_model

            t0 = time.time()
            try:
                path = resolve_base_model(self.spec["base_model"], self.home)
            except FileNotFoundError as exc:
                raise ValueError(str(exc)) from None
            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            model, tokenizer = load_model_and_tokenizer(
                path, device, "bfloat16" if str(device).startswith("cuda") else cpu_reading_dtype())
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            self._base = (model, tokenizer)
            self.seconds["load"] = round(time.time() - t0, 3)
        return self._base


def cpu_reading_dtype() -> str:
    """The dtype the base model's weights load in to read prompts on this CPU: "bfloat16" where
    the CPU computes in it natively (AVX512-BF16 or AMX), else "float32".

    Why bfloat16: the heads were fitted on what the base model read on a GPU host with its weights
    in bfloat16 (models.training.gpu_host.llm_code), and a bfloat16 reading here lands as near the
    host's forecasts as a float32 one does (benchmarks/embed_precision.py on eval pairs of the
    committed run; docs/results/forecasting-speed.md) in less CPU time. A CPU without those
    instructions emulates bfloat16 slower than it computes float32, so it keeps float32.
    """
    import torch

    native = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:
        return "bfloat16" if any(check() for check in native if check is not None) else "float32"
    except RuntimeError:  # a build that cannot tell: the reading that works everywhere
        return "float32"


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
