"""Language-model forecasters as adapters: a registered surrogate version (its calibrator
applied), a base model or local checkpoint, an OpenAI-compatible endpoint.

The prompt of a pair is the one the surrogate was trained on (made by the training row
builder, models.training.rows.pair_prompt): task description, the two sources (the task
reference shown as its PyTorch body), the device's fingerprint, and with "+features" styles the
benchmark shapes and each side's compile features; a record without compile features shows
n/a, one without generator metadata is read like any other.

Numbers: `forecast_pairs` and `forecast_rows` are the evaluation's (an unparsed answer counts as
uniform, then the version's calibrator applies to every row: llm_shards' rows);
`forecast_records` keeps each answer as a `models.forecast.Forecast`, parsed ones calibrated and
unparsed ones as failures with their parse error, which is what the command line prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from models.bins import NUM_BINS
from pipelines.forecasting.base import PairForecaster, check_pairs, rows_of
from pipelines.forecasting.prompt_records import HardwareTable, record_features


def pair_prompt(row: Mapping[str, Any], kernels: Mapping[str, Mapping[str, Any]], hardware: Mapping[str, Any],
                style: str) -> list[dict[str, str]]:
    """The chat messages of one pair (a row with task, anchor_kernel_id, candidate_kernel_id) from
    kernel records: the evaluation's prompt (pipelines.forecasting.lm_forecasts.pair_messages, the
    training row builder's) of each record's source, generator and compile features."""
    from pipelines.forecasting.lm_forecasts import pair_messages

    ids = (row["anchor_kernel_id"], row["candidate_kernel_id"])
    shown = {k: (kernels[k].get("source") or "", kernels[k].get("generator")) for k in ids}
    return pair_messages(row, shown, hardware, style, {k: record_features(kernels[k]) for k in ids})


class LanguageForecaster(PairForecaster):
    """A language model behind a `models.backends` forecaster.

    Args:
        backend: anything with `forecast(requests) -> [Forecast]` (loaded already).
        model_ref: what its rows are stored under.
        style: the prompt style it reads.
        calibrator: the registered version's calibrator (None: forecasts as they come).
        hardware: hardware_id -> fingerprint (HardwareTable).
        source: how it came to be (for listings and the command line).
        fits: optional check(messages) raising ValueError when a prompt exceeds the context.
    """

    kind = "llm"

    def __init__(self, backend: Any, model_ref: str, style: str, calibrator: Any = None,
                 hardware: Callable[[str], Mapping[str, Any]] | None = None, source: str = "",
                 fits: Callable[[list[dict]], Any] | None = None, readout: str = "logprob"):
        self.backend, self.model_ref, self.style = backend, model_ref, style
        self.calibrator, self.source, self.fits, self.readout = calibrator, source, fits, readout
        self.hardware = hardware or HardwareTable()

    def requests(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """{"pair_id", "prompt"} per pair: what a sharded run (pipelines.forecasting.llm_shards) carries."""
        check_pairs(pairs, kernels)
        return [{"pair_id": r["pair_id"], "prompt": pair_prompt(r, kernels, self.hardware(r["hardware_id"]), self.style)}
                for r in pairs.iter_rows(named=True)]

    def raw_answers(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]],
                    check_fits: bool = False) -> list[Any]:
        """The backend's answers (uncalibrated Forecasts), one per pair; with `check_fits`, a prompt
        longer than the model's context is a failure naming it, and is never run."""
        from models.backends import BackendError, ForecastRequest
        from models.forecast import Forecast

        reqs = self.requests(pairs, kernels)
        out: list[Any] = [None] * len(reqs)
        todo = []
        for i, r in enumerate(reqs):
            if check_fits and self.fits is not None:
                try:
                    self.fits(r["prompt"])
                except ValueError as exc:
                    out[i] = Forecast.failure(str(exc), readout=self.readout)
                    continue
            todo.append(i)
        if todo:
            try:
                answers = self.backend.forecast([ForecastRequest(reqs[i]["prompt"], reqs[i]["pair_id"]) for i in todo])
            except BackendError as exc:
                raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
            for i, a in zip(todo, answers, strict=True):
                out[i] = a
        return out

    def _calibrate(self, p: np.ndarray) -> np.ndarray:
        # Applied even when it is the identity, as the evaluation's rows are (its floor on p).
        return p if self.calibrator is None else self.calibrator.apply(p)

    def forecast_records(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]],
                         check_fits: bool = False) -> list[Any]:
        """One `Forecast` per pair: parsed ones calibrated, unparsed ones kept with their error."""
        from models.forecast import Forecast

        out = []
        for a in self.raw_answers(pairs, kernels, check_fits):
            if not a.parse_ok or a.p is None or self.calibrator is None or self.calibrator.is_identity:
                out.append(a)
                continue
            p = self._calibrate(np.asarray([list(a.p)]))[0]
            out.append(Forecast.from_probabilities(list(p), predicted_bin=int(p.argmax()) + 1, readout=a.readout))
        return out

    def answer_pairs(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]],
                     strict: bool = False) -> list[tuple[list[float] | None, str | None]]:
        """Per pair, (its calibrated probabilities, None) or (None, why): a prompt over the base
        model's context (raised with `strict`), or "no forecast: <parse error>"."""
        out: list[tuple[list[float] | None, str | None]] = [(None, None)] * pairs.height
        keep = []
        for i, r in enumerate(self.requests(pairs, kernels)):
            if self.fits is not None:
                try:
                    self.fits(r["prompt"])
                except ValueError as exc:
                    if strict:
                        raise
                    out[i] = (None, str(exc))
                    continue
            keep.append(i)
        records = self.forecast_records(pairs[keep], kernels) if keep else []
        for i, rec in zip(keep, records, strict=True):
            out[i] = ((list(map(float, rec.p)), None) if rec.parse_ok and rec.p is not None
                      else (None, f"no forecast: {rec.parse_error}"))
        return out

    def _matrix(self, answers: Sequence[Any]) -> np.ndarray:
        p = np.array([a.p if a.p else [1 / NUM_BINS] * NUM_BINS for a in answers], dtype=np.float64)
        return self._calibrate(p.reshape(-1, NUM_BINS))

    def _probs(self, pairs, kernels):
        return self._matrix(self.raw_answers(pairs, kernels))

    def forecast_rows(self, pairs: pl.DataFrame, kernels: Mapping[str, Mapping[str, Any]]) -> pl.DataFrame:
        """Rows for the `forecasts` table with each answer's parse status and error kept."""
        if pairs.is_empty():
            return pl.DataFrame()
        answers = self.raw_answers(pairs, kernels)
        return rows_of(pairs, self._matrix(answers), self.model_ref, parse_ok=[bool(a.parse_ok) for a in answers],
                       parse_error=[a.parse_error for a in answers], raw_sum=[a.raw_sum for a in answers])
