"""What a code-embed version does for a pair no run held, on plain records: no polars, MLflow
or DuckDB, so the same code answers inside the platform (pipelines.forecasting.embed) and on a
GPU host from a forecaster file (pipelines.forecasting.embed_file).

For each pair, as the host did for the pairs of its run: the same prompt from the two sources
(models.training.gpu_host.job.training_rows, with the job's task and hardware tables kept with
the head), the base model's prefill over it on this machine (the same layers; on a GPU padded
batches with the weights in bfloat16, as the host ran it; on a CPU the weights in
`cpu_reading_dtype` and models.training.head.embed_prompts_shared, which prefills what the
prompts share, the anchor's half of every pair of one anchor, once: the numbers of a full
prefill of each prompt up to round-off, in about half the tokens), its coordinates on the
stored principal axes (`project`), the pair's feature vector
(pipelines.surrogates.embed_rows.pair_feature_vectors), then the head
(models.training.embed_head.EmbedHead: trees, Laplace spreads) and the version's calibrator.

The base model loads on the first pair that needs it (a few seconds for SmolLM2-135M).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

TOKENS_PER_BATCH = 8192  # a prefill batch: a few hundred MB of hidden states at most


class EmbedReader:
    """A code-embed head and the base model it reads prompts with.

    Args:
        head, axes, spec: `models.training.embed_head.load_embed_head` of its head file (the head
            may be its portable twin, `EmbedHead.portable`).
        calibrator: the version's calibrator, applied to the head's forecasts (None: none).
        home: KERNELCAST_HOME (where the base model is found or converted).
        hardware: hardware_id -> fingerprint for a device the bundle did not know (HardwareTable).
        device: where the base model runs (None: cuda when available, else the CPU).
    Rows are dicts with task, hardware_id, anchor_kernel_id and candidate_kernel_id; kernels
    maps those ids to kernel records (source, language, generator, compile features).
    """

    def __init__(self, head: Any, axes: Mapping[str, np.ndarray], spec: Mapping[str, Any], calibrator: Any = None,
                 home: str | Path | None = None, hardware: Any = None, device: str | None = None):
        from pipelines.forecasting.prompt_records import HardwareTable

        self.head, self.axes, self.spec = head, dict(axes), dict(spec)
        self.calibrator, self.home, self.device = calibrator, home, device
        self.hardware = hardware or HardwareTable()
        self.style = self.spec["style"]
        self.parts, self.k = tuple(self.spec["parts"]), int(self.spec["components"])
        self._base: tuple[Any, Any] | None = None
        self.seconds: dict[str, float] = {}  # what the last new pairs took: load, prefill, the rest

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_base": None, "seconds": {}}  # the base model is read again where it lands

    def calibrated_probs(self, rows: list[dict[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, 8) forecasts of the rows: the head's, then the version's calibrator."""
        p = self.head_probs_of(rows, kernels)
        return p if self.calibrator is None else self.calibrator.apply(p)

    def head_probs_of(self, rows: list[dict[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, 8) forecasts of the head before the version's calibrator, every row read here."""
        return self.head.predict_proba(self.design_of(rows, kernels), [r["task"] for r in rows])

    def design_of(self, rows: list[dict[str, Any]], kernels: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
        """(n, width) rows the trees read: the features, the first k coordinates, the zero-shot
        logits, as pipelines.surrogates.code_embed lays them out for the pairs of a run."""
        from pipelines.surrogates.embed_rows import design, pair_feature_vectors

        t0 = time.time()
        keys = [f"pair-{i}" for i in range(len(rows))]  # a frame may hold one pair id twice
        feats = (pair_feature_vectors(self.spec["feature_names"], [kernels[r["anchor_kernel_id"]] for r in rows],
                                      [kernels[r["candidate_kernel_id"]] for r in rows])
                 if "features" in self.parts else [[] for _ in rows])
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
        from pipelines.forecasting.prompt_records import record_features
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

    def base_model_path(self) -> Path:
        """The base model's checkpoint folder (models.base_model.resolve_base_model of the spec).

        Raises:
            ValueError: it is not available here (one line).
        """
        from models.base_model import resolve_base_model

        try:
            return resolve_base_model(self.spec["base_model"], self.home)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None

    def _base_model(self) -> tuple[Any, Any]:
        """The base model and tokenizer, once: bfloat16 on a GPU, as the host loaded it; on a
        CPU `cpu_reading_dtype()`."""
        if self._base is None:
            import torch

            from models.backends.transformers_backend import load_model_and_tokenizer

            t0 = time.time()
            path = self.base_model_path()
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
