"""Trainer callbacks of surrogate training (models.training).

MlflowMetricsCallback: every trainer log line (loss, rewards, ...) streamed into the run's MLflow
run as it is written (live curves in the UI).

NonFiniteGradGuard: skip optimizer steps whose gradients are not finite, instead of writing
NaN into the weights.

Why: on the H200 two GRPO runs of SmolLM2 logged `grad_norm: nan` once (after
11 steps of grad norms 0.23-0.41 in one run, at the first step in another) and the optimizer
then wrote NaN into the LoRA weights; the next rollout's sampler failed with a device-side
assert ("probability tensor contains either inf, nan or element < 0") and the whole run, its
adapter and every later step were lost. A single bad micro-batch should cost one step, not the
run. Gradient clipping does not help: a NaN norm makes the clip factor NaN too. (The source
found, cuDNN's attention backward on torch 2.11, is switched off in models.training.grpo; the
guard stays for whatever else a long run meets.)

The guard runs after the gradients of an optimizer step are accumulated and clipped and before
the step: if any trainable gradient holds a NaN or inf, every gradient is dropped (AdamW skips
parameters without one), the step is counted, and after `max_consecutive` such steps in a row
training stops (the caller reports it), since then the model itself is broken, not a batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from models.registry.tracking import step_metrics, tracking_client

log = logging.getLogger(__name__)


def grads_finite(params: list[Any]) -> bool:
    """True when every gradient in `params` is finite (one device sync, not one per tensor).

    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.tensor([1.0, float("nan")])
    >>> grads_finite([p]), grads_finite([])
    (False, True)
    """
    import torch

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return True
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


class NonFiniteGradGuard(TrainerCallback):
    """Drops the gradients of a step that are not all finite; stops after too many in a row.

    Attributes:
        skipped_steps: 1-based optimizer steps whose update was skipped.
        gave_up: True when `max_consecutive` steps in a row were skipped (training stopped).
    """

    def __init__(self, max_consecutive: int = 3) -> None:
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.skipped_steps: list[int] = []
        self.consecutive = 0
        self.gave_up = False

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> Any:
        if optimizer is None:
            return control
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if grads_finite(params):
            self.consecutive = 0
            return control
        for p in params:
            p.grad = None
        step = state.global_step + 1
        self.skipped_steps.append(step)
        self.consecutive += 1
        log.warning("step %d: non-finite gradients, update skipped (%d in a row)", step, self.consecutive)
        if self.consecutive >= self.max_consecutive:
            self.gave_up = True
            control.should_training_stop = True
        return control


class StopAt(TrainerCallback):
    """Ends training after the first step that ends past `stop_at` (a time.time() value), so
    a run with a wall-clock limit (a GPU job) stops at a whole, checkpointed step instead of
    being killed inside one."""

    def __init__(self, stop_at: float) -> None:
        self.stop_at = stop_at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if time.time() >= self.stop_at:
            control.should_training_stop = True
        return control


class MlflowMetricsCallback(TrainerCallback):
    """Streams every trainer log line (loss, rewards, frac_reward_zero_std, ...) into one run."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.logged = 0  # log lines sent, for tests and reports

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        metrics = step_metrics(logs or {}, state.global_step)
        if metrics:
            tracking_client(self.tracking_uri).log_batch(self.run_id, metrics=metrics)
            self.logged += 1
        return control
