"""Evaluation of forecasts: proper scores, calibration, selective prediction, utility under a
measurement budget, discovery moments, bootstrap intervals, figures and an HTML report
(method.md sections 3 and 4). Pure numpy/polars; no Dagster, no SQL."""

from pipelines.evaluation.evaluate import evaluate_file, evaluate_forecasts
from pipelines.evaluation.report import write_report

__all__ = ["evaluate_file", "evaluate_forecasts", "write_report"]
