"""A registered code-embed version as a forecaster file for a GPU host: its head, principal
axes, spec and calibrator, without the base model's weights, answering the search's
`predict_kernels` with torch, transformers, numpy and pandas (no MLflow, polars, DuckDB,
Dagster or scikit-learn).

`kernelcast export-forecaster models:/...@champion` writes one (pickled) when the version is a
code-embed one (pipelines.search.registered.portable_forecaster). Where it runs it reads each
pair exactly as the registered version does (pipelines.forecasting.embed_reader.EmbedReader, the
one implementation both use), with the head's trees walked by numpy
(models.training.embed_head.EmbedHead.portable), so its forecasts are the registered version's.

The base model: SmolLM2 ("smollm2", the version's base) is read from the GGUF file that
$KERNELCAST_BASE_GGUF names, converted once into $KERNELCAST_HOME/models/ (transformers reads a
GGUF through the `gguf` package); another base (a local checkpoint, the test model "tiny") is
found as the platform finds it (models.base_model.resolve_base_model). It runs on CUDA in
bfloat16 when a GPU is there, else on the CPU. The compile features of the Triton candidates
the file does not know are computed where it runs, as the exported cost model does
(`compiler`, `compile_workers`: models.classical.portable.compile_missing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.base_model import GGUF_ENV, SMOLLM2_GGUF, SMOLLM2_SPEC
from models.bins import NUM_BINS
from models.classical.features import with_compile_features
from models.classical.portable import Compiler, compile_missing
from pipelines.forecasting.embed_reader import EmbedReader


class PortableEmbedHead(EmbedReader):
    """The prediction half of a code-embed version, for a forecaster file.

    Args:
        reader: the registered version's reader (an EmbedHeadForecaster): its head, axes, spec,
            calibrator and hardware table are kept, the head as its numpy twin.
        name: what the search prints for it.
        features: kernel id -> compile features, filled into records that lack them.
        compile_workers: > 0 computes the compile features of unknown Triton candidates with
            `compiler` in that many processes before forecasting them.
        compiler: (records, n_workers) -> compile-feature rows (source_features_many).
    """

    kind = "llm"

    def __init__(self, reader: EmbedReader, name: str, features: Mapping[str, Mapping[str, Any]] | None = None,
                 compile_workers: int = 0, compiler: Compiler | None = None):
        from pipelines.forecasting.prompt_records import HardwareTable

        hardware = HardwareTable(None, getattr(reader.hardware, "known", None))  # no warehouse where it runs
        super().__init__(reader.head.portable(), reader.axes, reader.spec, reader.calibrator, None, hardware)
        self.name = name
        self.features = {k: dict(v) for k, v in (features or {}).items()}
        self.compile_workers, self.compiler = compile_workers, compiler

    def host_needs(self) -> str:
        """What the host it runs on needs beyond numpy and pandas, in words."""
        base = str(self.spec["base_model"])
        if base.strip().lower() == SMOLLM2_SPEC:
            return (f"torch and transformers, the gguf package, ${GGUF_ENV} naming {SMOLLM2_GGUF} "
                    "(converted once under $KERNELCAST_HOME/models)")
        return f"torch and transformers, the base model {base!r}"

    def base_model_path(self) -> Path:
        """The base model's checkpoint: SmolLM2 from $KERNELCAST_BASE_GGUF (converted once),
        any other base as the platform finds it.

        Raises:
            ValueError: $KERNELCAST_BASE_GGUF unset or not a file, no gguf package, or another
                base not available here (one line).
        """
        if str(self.spec["base_model"]).strip().lower() == SMOLLM2_SPEC:
            gguf = os.environ.get(GGUF_ENV)
            if not gguf:
                raise ValueError(f"${GGUF_ENV} is not set: point it at {SMOLLM2_GGUF}, the base model this forecaster reads")
            if not Path(gguf).is_file():
                raise ValueError(f"${GGUF_ENV} points to {gguf}, which is not a file")
            try:
                return super().base_model_path()
            except ImportError as exc:  # transformers reads a GGUF through the gguf package
                raise ValueError(f"reading {gguf} needs the gguf package (pip install gguf): {exc}".splitlines()[0]) from None
        return super().base_model_path()

    def compile_missing(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Compute and remember the compile features of the unknown Triton kernels among `records`."""
        return compile_missing(records, self.features, self.compiler, self.compile_workers)

    def predict_kernels(self, anchor: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                        hardware_id: str) -> np.ndarray:
        """(n, 8) forecasts of each candidate against one anchor (the search's hook)."""
        if not candidates:
            return np.zeros((0, NUM_BINS))
        self.compile_missing([anchor, *candidates])
        kernels = {"anchor": with_compile_features(anchor, self.features)}
        rows = []
        for i, c in enumerate(candidates):  # ids by position: two records under one id stay two kernels
            kernels[f"candidate-{i}"] = with_compile_features(c, self.features)
            rows.append({"task": str(c.get("task") or anchor.get("task") or ""), "hardware_id": hardware_id,
                         "anchor_kernel_id": "anchor", "candidate_kernel_id": f"candidate-{i}"})
        return self.calibrated_probs(rows, kernels)
