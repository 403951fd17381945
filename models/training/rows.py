"""Training rows: one chat prompt per training pair, with its true bin, and the rows whose prompt
fits the model's context.

`pair_prompt` is the one builder of a pair's prompt: the surrogates were trained on its text, so
the evaluation's and the forecasting adapters' prompts are made by it too (a prompt differing by
a byte from the training text is a different input to the model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from models.prompts import build_prompt

if TYPE_CHECKING:  # polars only for type hints: the GPU host trains without it
    import polars as pl


def build_training_rows(
    pairs: pl.DataFrame | Sequence[Mapping[str, Any]],
    kernels: Mapping[str, str],
    tasks: Mapping[str, str] | Mapping[str, Mapping[str, Any]],
    hardware: Mapping[str, Any] | Mapping[str, Mapping[str, Any]],
    style: str = "diff",
    features: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One dataset row per pair: the prompt, the true bin and the pair id.

    Args:
        pairs: pairs rows (`warehouse.read_pairs(..., split="train")`, or plain dicts): task,
            anchor_kernel_id, candidate_kernel_id, true_bin, pair_id, hardware_id. The caller
            passes training pairs only (method.md: never an eval pair).
        kernels: kernel_id -> source.
        tasks: task name -> one-paragraph description, or -> {"description": ...,
            "benchmark_cases": [...]} (the cases are shown by "+features" styles).
        hardware: one fingerprint for every pair, or hardware_id -> fingerprint.
        style: prompt style ("diff" for small models, "full" as the paper; "+features" adds
            compile features and benchmark shapes, models/prompts.py).
        features: kernel_id -> compile features (n_regs, n_spills, shared_bytes, n_kernels,
            n_launches), for "+features" styles; a kernel without features shows n/a.
    Returns:
        [{"prompt": chat messages, "true_bin": int, "pair_id": str}], in the pairs' order.
    Raises:
        KeyError: a kernel source or task description is missing (one line naming it).
    """
    per_id = bool(hardware) and all(isinstance(v, Mapping) for v in hardware.values())
    rows = []
    items = pairs.iter_rows(named=True) if hasattr(pairs, "iter_rows") else pairs
    for pair in items:
        hw = hardware.get(pair.get("hardware_id"), {}) if per_id else hardware
        rows.append({"prompt": pair_prompt(pair, kernels, tasks, hw, style, features),
                     "true_bin": int(pair["true_bin"]), "pair_id": str(pair["pair_id"])})
    return rows


def pair_prompt(
    pair: Mapping[str, Any],
    kernels: Mapping[str, str],
    tasks: Mapping[str, str] | Mapping[str, Mapping[str, Any]],
    hardware: Mapping[str, Any],
    style: str = "diff",
    features: Mapping[str, Mapping[str, Any] | None] | None = None,
) -> list[dict[str, str]]:
    """The chat messages of one pair, as the surrogates were trained on them.

    Args:
        pair: task, anchor_kernel_id, candidate_kernel_id (pair_id names it in errors).
        kernels: kernel_id -> the source the model reads (the task reference as its PyTorch
            body: pipelines.tasks.prompt_source).
        tasks: as `build_training_rows`' (the benchmark cases shown by "+features" styles).
        hardware: the pair's device fingerprint.
        style: prompt style (models/prompts.py).
        features: kernel_id -> compile features for "+features" styles (absent or None: n/a).
    Returns:
        [{"role": "system", ...}, {"role": "user", ...}].
    Raises:
        KeyError: a kernel source or task description is missing (one line naming it).
    """
    for key in ("anchor_kernel_id", "candidate_kernel_id"):
        if pair[key] not in kernels:
            raise KeyError(f"pair {pair.get('pair_id')}: no source for kernel {pair[key]}")
    if pair["task"] not in tasks:
        raise KeyError(f"pair {pair.get('pair_id')}: no description for task {pair['task']!r}")
    task = tasks[pair["task"]]
    description = task if isinstance(task, str) else task["description"]
    cases = None if isinstance(task, str) else task.get("benchmark_cases")
    features = features or {}
    return build_prompt(pair["task"], description, kernels[pair["anchor_kernel_id"]],
                        kernels[pair["candidate_kernel_id"]], dict(hardware), style, benchmark_cases=cases,
                        anchor_features=features.get(pair["anchor_kernel_id"]),
                        candidate_features=features.get(pair["candidate_kernel_id"]))


def prompt_tokens(tokenizer: Any, prompt: Any) -> int:
    """Tokens of a training row's prompt as the trainer feeds it (chat template applied)."""
    from models.backends.transformers_backend import render_chat

    text = prompt if isinstance(prompt, str) else render_chat(tokenizer, prompt)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fitting_rows(rows: Sequence[dict[str, Any]], tokenizer: Any, limit: int | None) -> list[dict[str, Any]]:
    """The rows whose prompt has at most `limit` tokens (all of them when limit is None)."""
    if limit is None:
        return list(rows)
    return [r for r in rows if prompt_tokens(tokenizer, r["prompt"]) <= limit]
