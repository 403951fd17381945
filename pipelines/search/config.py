"""Settings of one budgeted search run (method.md section 6), as a frozen, JSON-able value.

Modes, all spending the SAME number of GPU measurements (`budget`):
    standard   `measure_per_parent` mutations of each parent, all measured
    filtered   `proposals_per_parent` mutations forecast, the top `measure_per_parent` by score
               measured (the surrogate-filtered search)
    random     `proposals_per_parent` mutations, `measure_per_parent` of them at random (the
               control that shows whether the forecaster's ranking matters)
    selective  as filtered, but a candidate whose forecast is confident (max probability >=
               `confidence`) is trusted without measuring: its forecast speedup stands in for a
               measurement, and the GPU slots go to the uncertain candidates first

Defaults follow the paper's public configs (codezakh/gpu-forecasters,
runbook/configs/kernel_search/*.json): 2 parents a step, 4 or 16 mutations a parent, archive
capacity 1000, c_puct 1.0. One deliberate difference: the paper's standard run admits the top 2
children of a parent into the archive and its filtered run the top 4; here every mode admits
the same `admit_per_parent`, so the modes differ only in which candidates reach the GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MODES = ("standard", "filtered", "random", "selective")
FORECASTING_MODES = ("filtered", "selective")  # modes that spend forecasts
ANCHORS = ("reference", "parent")
DEFAULT_HARDWARE = "nvidia-h200-sm90"


@dataclass(frozen=True)
class SearchConfig:
    """One run: a task, a mode, a seed and a measurement budget.

    The log of a run starts with this config; resuming a log with another config is refused.
    """

    task: str
    mode: str
    seed: int
    budget: int  # GPU measurements after the root (the seed kernel, measured once by every mode)
    batch_size: int = 2  # parents expanded per step, lineage-blocked
    measure_per_parent: int = 4  # GPU measurements per parent per step
    proposals_per_parent: int = 16  # mutations drawn per parent by filtered/random/selective
    admit_per_parent: int = 2  # children of one parent admitted to the archive per step
    capacity: int = 1000  # archive size; the root is never evicted
    c_puct: float = 1.0
    confidence: float = 0.7  # selective: max probability at which a forecast is trusted
    # Forecast anchor. "reference": the task's PyTorch reference (speedups of most kernels here
    # sit in bins 7-8 against it, so rankings among siblings tie often); "parent": the kernel
    # being mutated, so bins resolve the step from parent to child.
    anchor: str = "reference"
    hardware_id: str = DEFAULT_HARDWARE
    forecaster: str = ""  # name of the forecaster, recorded with the run

    def validate(self) -> SearchConfig:
        """Return self, or raise ValueError naming the first bad field."""
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.anchor not in ANCHORS:
            raise ValueError(f"anchor must be one of {', '.join(ANCHORS)}, got {self.anchor!r}")
        for name in ("budget", "batch_size", "measure_per_parent", "proposals_per_parent",
                     "admit_per_parent", "capacity"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.proposals_per_parent < self.measure_per_parent:
            raise ValueError("proposals_per_parent must be >= measure_per_parent")
        if not 0.0 < self.confidence <= 1.0:
            raise ValueError(f"confidence must be in (0, 1], got {self.confidence}")
        return self

    @property
    def draws_per_parent(self) -> int:
        """Mutations drawn per parent: standard measures what it draws, the others filter."""
        return self.measure_per_parent if self.mode == "standard" else self.proposals_per_parent

    @property
    def forecasts(self) -> bool:
        return self.mode in FORECASTING_MODES

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown search config fields: {', '.join(unknown)}")
        return cls(**data).validate()

    def run_name(self) -> str:
        """A file-name-safe name: task-mode-seed."""
        return f"{self.task}-{self.mode}-s{self.seed}"
