"""The report's forecaster table: one row per forecaster and split, what `kernelcast report` prints.

    rows = forecaster_rows(results, kinds, "in_distribution")

Each row: name, kind, split, source, n, brier (with its 95% bootstrap interval brier_lo /
brier_hi), crps, ece, accuracy, recovered_mean (recovered_lo / recovered_hi), recovered_random,
parse_rate, run_id and mlflow_url (the MLflow run that logged a registered version; null for
the others), dagster_run_id and dagster_url (the Dagster run that made that MLflow run), selective_coverage (external split: the coverage at which its max-prob-selected
forecasts reach the best forecaster's full-coverage Brier; null on the other splits). Names are
model refs; the held-out twins of the reference forecasters lose their "|<split>" suffix, since
the split column says where they were scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from models.registry import HELD_OUT_MODEL, SURROGATE_MODEL

TABLE_FILE = "forecasters.table.json"


RUN_FIELDS = ("run_id", "mlflow_url", "dagster_run_id", "dagster_url")


def run_fields(value: Mapping[str, Any] | tuple | None) -> dict[str, Any]:
    """A forecaster's run links as RUN_FIELDS, from `MlflowResource.run_links`' mapping or a
    (run id, MLflow URL) pair.

    >>> run_fields(("ab", "http://127.0.0.1:5000/#/runs/ab"))["dagster_run_id"] is None
    True
    """
    if isinstance(value, Mapping):
        return {k: value.get(k) for k in RUN_FIELDS}
    pair = tuple(value or ())[:2]
    return dict(zip(RUN_FIELDS, pair + (None,) * (4 - len(pair)), strict=True))


def _kind_of(ref: str, kinds: Mapping[str, str]) -> str:
    if ref in kinds:
        return kinds[ref]
    return "baseline" if ref.startswith("baseline:") else ("llm" if ref.startswith(("base:", "h200:")) else "unknown")


def _interval(result: Mapping[str, Any], key: str) -> tuple[float | None, float | None]:
    ci = (result.get("intervals") or {}).get(key)
    return (ci[0], ci[1]) if ci else (None, None)


def forecaster_rows(results: Mapping[str, Mapping[str, Any]], kinds: Mapping[str, str], split: str,
                    sources: Mapping[str, str] | None = None, runs: Mapping[str, Any] | None = None,
                    coverage: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """Rows of one split's evaluation results (`pipelines.evaluation.suite.evaluate_models`).

    Args:
        results, kinds, split, sources: the split's results, model -> kind, the split, model -> source.
        runs: model -> its run links (`run_fields`).
        coverage: model -> selective coverage (the external split's).
    """
    rows = []
    for ref, r in sorted(results.items()):
        links = run_fields((runs or {}).get(ref))
        b_lo, b_hi = _interval(r, "brier")
        u_lo, u_hi = _interval(r, "recovered_mean")
        rows.append({
            "name": ref.removesuffix(f"|{split}"), "kind": _kind_of(ref, kinds), "split": split,
            "source": (sources or {}).get(ref, ""), "n": r.get("n"), "brier": r.get("brier"), "brier_lo": b_lo,
            "brier_hi": b_hi, "crps": r.get("crps"), "ece": r.get("ece"), "accuracy": r.get("accuracy"),
            "recovered_mean": r.get("recovered_mean"), "recovered_lo": u_lo, "recovered_hi": u_hi,
            "recovered_random": r.get("recovered_random_mean"), "parse_rate": r.get("parse_rate"),
            **links, "selective_coverage": (coverage or {}).get(ref),
        })
    return rows


ALIAS_MARKS = {"champion": "@champ", "champion-external": "@champ-ext", "challenger": "@chall",
               "challenger-external": "@chall-ext"}  # short: two marks and the table stay within 100 columns


def short_name(ref: str) -> str:
    """A forecaster's name as the tables print it: registered versions by model and number.

    >>> short_name("models:/kernelcast-surrogate/5"), short_name("models:/kernelcast-surrogate-held-out/3")
    ('surrogate/5', 'held-out/3')
    """
    return ref.replace(f"models:/{HELD_OUT_MODEL}/", "held-out/").replace(
        f"models:/{SURROGATE_MODEL}/", "surrogate/")


def text_table(rows: list[dict[str, Any]], aliases: dict[str, list[str]] | None = None) -> list[str]:
    """The rows as fixed-width lines that fit 100 columns; `aliases` (model ref -> the aliases
    naming it) marks the champions and challengers."""
    def f(v: Any, w: int, d: int = 3) -> str:
        return f"{v:>{w}.{d}f}" if isinstance(v, float) else f"{'' if v is None else v:>{w}}"

    def name(n: str, w: int) -> str:  # a long name loses its start, never its version number
        n = short_name(n)
        return n if len(n) <= w else "~" + n[-(w - 1):]

    def marks(ref: str) -> str:
        return " ".join(ALIAS_MARKS.get(a, "@" + a) for a in (aliases or {}).get(ref, []))

    cov = any(r.get("selective_coverage") is not None for r in rows)
    width = 25
    lines = [f"{'forecaster':<{width}}{'kind':>11}{'n':>6}{'brier':>7} {'95% CI':<13}{'ece':>6}{'recov':>6}"
             + (f"{'cover':>6}" if cov else "") + "  alias"]
    for r in rows:
        ci = f"[{r['brier_lo']:.3f},{r['brier_hi']:.3f}]" if r.get("brier_lo") is not None else ""
        line = (f"{name(r['name'], width):<{width}}{r['kind'][:10]:>11}{f(r['n'], 6)}{f(r['brier'], 7)} {ci:<13}"
                f"{f(r['ece'], 6)}{f(r['recovered_mean'], 6)}" + (f(r.get("selective_coverage"), 6, 2) if cov else ""))
        lines.append((line + "  " + marks(r["name"])).rstrip())
    lines[0] = lines[0].removesuffix("  alias") if not any(marks(r["name"]) for r in rows) else lines[0]
    return lines
