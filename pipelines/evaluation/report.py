"""One HTML page per evaluation split: which forecaster to trust first, then the tables and figures.

The first screen (a 1400-pixel window) answers "which forecaster should I trust for which
kernels": the promotion decisions (the version each champion alias names, what it is for, its
Brier on how many pairs), then one compact headline table, every forecaster on one line with its
aliases marked, its MLflow and Dagster runs; the figures follow (a handful of forecasters each:
`figures.pick_series`); all metrics, the per-task and discovery tables and the conventions are
folded below (<details>).

What changes after the page is written is read when it is opened: the champions from
promotion.js beside the report (written by model_promotion after the report; its name and the
decisions' HTML: pipelines.evaluation.decisions), the UIs' ports from reports/ui-ports.js (orchestration.links, written while
`kernelcast ui` serves), and the page's own path from the browser. Without them the page shows
what was known when it was written. `write_report` also writes the PNGs beside index.html, so
they can be logged as artifacts.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from pipelines.evaluation import figures
from pipelines.evaluation.decisions import decisions_html
from pipelines.evaluation.forecaster_table import run_fields, short_name

log = logging.getLogger(__name__)

HEADLINE = (
    ("n", "forecasts"), ("parse_rate", "parse rate"), ("brier", "Brier"), ("crps", "CRPS"),
    ("nll", "NLL"), ("accuracy", "accuracy"), ("off_by_one", "off-by-one"), ("ece", "ECE"),
    ("aurc", "AURC"), ("selective_risk_at_50", "risk@50%"), ("recovered_mean", "recovered (1-50%)"),
    ("recovered_at_10", "recovered@10%"), ("within_20", "within 20%"),
    ("recovered_random_mean", "random order"),
)
# The first screen's table: what tells forecasters apart (calibration, ranking), intervals beside
# the two that decide promotion and search; every metric is in the folded table below it.
COMPACT = (("n", "n"), ("nll", "NLL"), ("ece", "ECE"), ("accuracy", "accuracy"), ("selective_risk_at_50", "risk@50%"))
DISCOVERY = (("n", "pairs"), ("base_rate", "base rate"), ("precision", "precision"),
             ("recall", "recall"), ("f1", "F1"), ("pr_auc", "PR-AUC"))
ALIAS_LABELS = {"champion": "champion", "champion-external": "champion (files)", "challenger": "challenger",
                "challenger-external": "challenger (files)"}

_TEMPLATE = jinja2.Template(
    r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.2em 2em;max-width:1340px;color:#222}
h1{font-size:22px;margin:0 0 .3em}h2{font-size:17px;margin:1.1em 0 .4em}
nav,.meta{font-size:13px}.meta{color:#666;margin:.3em 0}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f4f4f4}th:first-child,td:first-child,td.kind,td.alias{text-align:left}
.ci{color:#777;font-size:11px}.note{color:#555;font-size:12px;margin:.3em 0}
.trust{border:1px solid #c9d7ea;background:#f3f7fc;padding:.4em 1em;border-radius:4px;max-width:1300px}
.trust ul{margin:.3em 0;padding-left:1.2em}.trust li{margin:.15em 0}
.badge{display:inline-block;font-size:11px;padding:0 5px;margin-right:3px;border-radius:3px;background:#e4e4e4}
.badge.champion,.badge.champion-external{background:#1f6f3f;color:#fff}
.badge.challenger,.badge.challenger-external{background:#d8e8dc;color:#1f4f2f}
tr.reference td{color:#777}tr.champ td:first-child{font-weight:600}
.figs{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}.figs img{max-width:440px}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600;font-size:15px}
</style></head><body>
<h1>{{ title }}</h1>
{% if pages %}<nav>Splits: {% for label, href in pages %}{% if href %}<a href="{{ href }}">{{ label }}</a>{% else %}<b>{{ label }}</b>{% endif %}{% if not loop.last %} | {% endif %}{% endfor %}</nav>{% endif %}
<p class="meta">This report: <span id="report-path">{{ path }}</span>{% if made_by %}; made by Dagster run <a data-ui="dagster" href="{{ made_by[1] }}">{{ made_by[0][:8] }}</a>{% endif %}</p>
<div class="trust"><b>Which forecaster to trust</b>
<ul id="decisions">{{ decisions_html }}</ul>
{% if bests %}<div class="note">Lowest Brier{% if bests|length > 1 %} by split{% endif %} (the oracle, which knows the answer, left out): {% for title, href, name, brier, n in bests %}{% if href %}<a href="{{ href }}">{{ title }}</a>{% else %}{{ title }}{% endif %} {{ name }} {{ "%.3f"|format(brier) }} ({{ n }} pairs){% if not loop.last %}; {% endif %}{% endfor %}.</div>{% endif %}
{% for note in split_notes %}<div class="note">{{ note }}</div>{% endfor %}
</div>
{% if empty %}<p class="note">{% for split, why in empty.items() %}{{ split }}: empty ({{ why }}){% if not loop.last %}; {% endif %}{% endfor %}</p>{% endif %}
<h2>Headline (Brier and recovered with {{ level }} bootstrap intervals over pairs)</h2>
<table class="headline"><tr><th>forecaster</th><th>alias</th><th>kind</th><th>Brier</th><th>recovered (1-50%)</th>{% for _, label in compact %}<th>{{ label }}</th>{% endfor %}<th>MLflow run</th><th>Dagster run</th></tr>
{% for name, res in rows %}{% set r = runs.get(name) %}<tr data-ref="{{ name.split('|')[0] }}" class="{{ 'reference' if name.startswith('baseline:') else '' }}"><td title="{{ name }}">{{ short(name) }}</td><td class="alias">{% for a in aliases.get(name.split('|')[0], []) %}<span class="badge {{ a }}">{{ alias_labels.get(a, a) }}</span>{% endfor %}</td><td class="kind">{{ kinds.get(name, '') }}</td>
<td>{{ fmt(res.get("brier")) }} {{ ci(res, "brier") }}</td><td>{{ fmt(res.get("recovered_mean")) }} {{ ci(res, "recovered_mean") }}</td>{% for key, _ in compact %}<td>{{ fmt(res.get(key)) }}</td>{% endfor %}
<td>{% if r and r.run_id %}<a data-ui="mlflow" href="{{ r.mlflow_url }}" title="{{ r.run_id }}">{{ r.run_id[:8] }}</a>{% else %}–{% endif %}</td><td>{% if r and r.dagster_run_id %}<a data-ui="dagster" href="{{ r.dagster_url }}" title="{{ r.dagster_run_id }}">{{ r.dagster_run_id[:8] }}</a>{% else %}–{% endif %}</td></tr>
{% endfor %}</table>
{% for note in notes %}<p class="note">{{ note }}</p>{% endfor %}
<h2>Figures ({{ series|length }} forecasters: {{ series|join(", ") }})</h2>
<div class="figs">{% for alt, data in images %}<img alt="{{ alt }}" src="data:image/png;base64,{{ data }}">{% endfor %}</div>
<details><summary>All metrics, every forecaster</summary>
<table><tr><th>model</th>{% for _, label in headline %}<th>{{ label }}</th>{% endfor %}</tr>
{% for name, res in rows %}<tr><td>{{ name }}</td>
{% for key, _ in headline %}<td>{{ fmt(res.get(key)) }}{% if res.get("intervals") and res["intervals"].get(key) %}<br><span class="ci">[{{ fmt(res["intervals"][key][0]) }}, {{ fmt(res["intervals"][key][1]) }}]</span>{% endif %}</td>{% endfor %}</tr>
{% endfor %}</table></details>
<details><summary>Per task</summary>
{% for name, res in rows %}<h3>{{ name }}</h3>
<table><tr><th>task</th>{% for _, label in headline %}<th>{{ label }}</th>{% endfor %}</tr>
{% for task, row in res.get("per_task", {}).items() %}<tr><td>{{ task }}</td>{% for key, _ in headline %}<td>{{ fmt(row.get(key)) }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endfor %}</details>
{% if discovered %}<details><summary>Discovery moments (parent &rarr; child)</summary>
{% for name, res in discovered %}<h3>{{ name }}</h3>
<table><tr><th>task</th>{% for _, label in discovery %}<th>{{ label }}</th>{% endfor %}</tr>
<tr><td><b>all</b></td>{% for key, _ in discovery %}<td>{{ fmt(res["discovery"].get(key)) }}</td>{% endfor %}</tr>
{% for task, row in res["discovery"].get("per_task", {}).items() %}<tr><td>{{ task }}</td>{% for key, _ in discovery %}<td>{{ fmt(row.get(key)) }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endfor %}</details>{% endif %}
<details><summary>Conventions</summary><ul>{% for c in conventions %}<li>{{ c }}</li>{% endfor %}</ul></details>
{% if ports_script %}<script src="{{ ports_script }}"></script>{% endif %}
{% if promotion_script %}<script src="{{ promotion_script }}"></script>{% endif %}
<script>
(function () {
  // The page's own place (a moved home shows its new path).
  if (location.protocol === "file:") {
    document.getElementById("report-path").textContent = decodeURIComponent(location.pathname);
  }
  // Links onto the ports the UIs serve on now (reports/ui-ports.js, written by `kernelcast ui`).
  var ports = window.KERNELCAST_UI_PORTS;
  if (ports) {
    document.querySelectorAll("a[data-ui]").forEach(function (a) {
      var port = ports[a.getAttribute("data-ui")];
      if (port) { a.href = a.getAttribute("href").replace(/^http:\/\/127\.0\.0\.1:\d+/, "http://127.0.0.1:" + port); }
    });
  }
  // The newest promotion decisions (promotion.js, written by model_promotion after this page).
  var promo = window.KERNELCAST_PROMOTION;
  if (promo) {
    var labels = {{ alias_labels_json }};
    document.getElementById("decisions").innerHTML = promo.html;
    document.querySelectorAll("table.headline tr[data-ref]").forEach(function (tr) {
      var cell = tr.querySelector("td.alias"), names = promo.aliases[tr.getAttribute("data-ref")] || [];
      cell.textContent = "";
      names.forEach(function (a) {
        var b = document.createElement("span");
        b.className = "badge " + a; b.textContent = labels[a] || a; cell.appendChild(b);
      });
      tr.classList.toggle("champ", names.some(function (a) { return a.indexOf("champion") === 0; }));
    });
  }
})();
</script>
</body></html>
""",
    autoescape=True,
)

def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


ORACLE = "baseline:oracle"


def _outside(results_by_model: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """"model: label" of every headline value the page shows outside its own bracket."""
    out = []
    for name, res in results_by_model.items():
        for key, label in HEADLINE:
            v, ci = res.get(key), (res.get("intervals") or {}).get(key)
            if isinstance(v, (int, float)) and ci and None not in ci[:2] and not math.isnan(v) \
                    and not ci[0] - 5e-5 <= v <= ci[1] + 5e-5:  # the page rounds to 4 decimals
                out.append(f"{name}: {label}")
    return out


def footnotes(results_by_model: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The notes under the headline table, from the numbers in it (never a constant).

    >>> footnotes({"baseline:oracle": {"recovered_mean": 0.982, "brier": 0.0}})
    ['Oracle (knows the true bin) recovered = 0.982: below 1 where kernels of one bin tie, ranked in random order within the bin.']
    >>> footnotes({"baseline:oracle|held_out_task": {"recovered_mean": 1.0}})
    ['Oracle (knows the true bin) recovered = 1.000.']
    >>> footnotes({"a": {"n": 788}, "b": {"n": 750}})[0]
    'Rows score different pair sets (forecasts: 750 for b; 788 for a): each forecaster is scored on the pairs it forecast, so compare rows of equal n (promotion compares versions on the pairs all of them forecast).'
    """
    notes = []
    oracle = next((r for name, r in results_by_model.items() if name.split("|")[0] == ORACLE), {})
    rec = oracle.get("recovered_mean")
    if isinstance(rec, (int, float)) and not math.isnan(rec):
        why = ": below 1 where kernels of one bin tie, ranked in random order within the bin" if rec < 1 - 5e-4 else ""
        notes.append(f"Oracle (knows the true bin) recovered = {rec:.3f}{why}.")
    by_n: dict[int, list[str]] = {}
    for name, res in results_by_model.items():
        if isinstance(res.get("n"), int):
            by_n.setdefault(res["n"], []).append(name)
    if len(by_n) > 1:
        groups = "; ".join(f"{n} for {', '.join(names)}" for n, names in sorted(by_n.items()))
        notes.append(f"Rows score different pair sets (forecasts: {groups}): each forecaster is scored on the pairs "
                     "it forecast, so compare rows of equal n (promotion compares versions on the pairs all of them "
                     "forecast).")
    outside = _outside(results_by_model)
    if outside:
        notes.append(f"Outside their bracket: {', '.join(outside)}. A percentile bootstrap interval of a metric "
                     "averaged over ranking pools need not contain the full-sample value when pools are small.")
    return notes


def display(name: str) -> str:
    """A forecaster's name on the page: registered versions by model and number, without the
    split suffix a reference forecaster's held-out twin carries (the page says the split).

    >>> display("baseline:bin_prior|held_out_task"), display("models:/kernelcast-surrogate/3")
    ('baseline:bin_prior', 'surrogate/3')
    """
    return short_name(name.split("|")[0])


def _ci(res: Mapping[str, Any], key: str) -> Any:
    ci = (res.get("intervals") or {}).get(key)
    if not ci or None in ci[:2]:
        return ""
    return jinja2.utils.markupsafe.Markup('<span class="ci">[{}, {}]</span>').format(f"{ci[0]:.3f}", f"{ci[1]:.3f}")


def lowest_brier(results: Mapping[str, Mapping[str, Any]]) -> tuple[str, float, int | None] | None:
    """(forecaster as shown, Brier, n) of the lowest Brier, the oracle left out; None if none.

    >>> lowest_brier({"baseline:oracle": {"brier": 0.0}, "models:/kernelcast-surrogate/2": {"brier": 0.3, "n": 9}})
    ('surrogate/2', 0.3, 9)
    """
    scored = [(n, r) for n, r in sorted(results.items(), key=_brier_order) if n.split("|")[0] != ORACLE
              and isinstance(r.get("brier"), (int, float)) and r["brier"] == r["brier"]]
    return (display(scored[0][0]), scored[0][1]["brier"], scored[0][1].get("n")) if scored else None


def _brier_order(item: tuple[str, Mapping[str, Any]]) -> tuple:
    """Rows by Brier, lowest first; the oracle (it knows the answer) last."""
    name, res = item
    b = res.get("brier")
    return (name.split("|")[0] == ORACLE, b if isinstance(b, (int, float)) and b == b else math.inf, name)


def write_report(
    results_by_model: Mapping[str, Mapping[str, Any]], out_dir: str | Path, title: str = "kernelcast evaluation",
    *, pages: list[tuple[str, str]] | None = None, runs: Mapping[str, Any] | None = None,
    empty: Mapping[str, str] | None = None, made_by: tuple[str, str] | None = None,
    kinds: Mapping[str, str] | None = None, promotion: Mapping[str, Any] | None = None,
    split_notes: list[str] | None = None, shown_path: str | None = None,
    ports_script: str | None = None, promotion_script: str | None = None,
    bests: list[tuple[str, str, str, float, int | None]] | None = None,
) -> Path:
    """Write index.html (and the figure PNGs) for several forecasters' results.

    Args:
        results_by_model: {model name: `evaluate_forecasts` result}.
        out_dir: created if missing.
        title: page title.
        pages: (label, relative href) of every page of the report, this one with href "".
        runs: model name -> its run links (`forecaster_table.run_fields`: MLflow run and URL, the
            Dagster run that made it and its URL).
        empty: split -> why it has no page.
        made_by: (Dagster run id, its URL) of the run that wrote the report.
        kinds: model name -> its kind (cost_model, llm, baseline, ...).
        promotion: the promotion decisions known now (`PromotionSummary.to_json()`).
        split_notes: what the reader should know about this split (one sentence each).
        shown_path: the page's path as the header names it (default: absolute); the browser
            replaces it with the place the page is opened from.
        ports_script, promotion_script: relative hrefs of reports/ui-ports.js and promotion.js.
        bests: the lowest Brier of each split, (split title, href of its page, forecaster,
            Brier, n); default: this page's (`lowest_brier`).
    Returns:
        Path of index.html.
    """
    if not results_by_model:
        raise ValueError("write_report needs at least one model's results")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    aliases = dict((promotion or {}).get("aliases") or {})
    champions = [ref for ref, names in aliases.items() if any(a.startswith("champion") for a in names)]
    series = figures.pick_series(results_by_model, first=[n for n in results_by_model if n.split("|")[0] in champions])
    shown = {display(name): results_by_model[name] for name in series} or dict(results_by_model)
    pngs = {
        "reliability.png": figures.reliability_figure(shown),
        "risk_coverage.png": figures.risk_coverage_figure(shown),
        "recovered.png": figures.recovered_figure(shown),
    }
    for name, data in pngs.items():
        (out / name).write_bytes(data)
    first = next(iter(results_by_model.values()))
    level = first.get("interval_level")
    rows = sorted(results_by_model.items(), key=_brier_order)
    if bests is None:
        found = lowest_brier(results_by_model)
        bests = [("this page", "", *found)] if found else []
    html = _TEMPLATE.render(
        title=title,
        rows=rows,
        headline=HEADLINE,
        compact=COMPACT,
        discovery=DISCOVERY,
        discovered=[(n, r) for n, r in rows if r.get("discovery")],
        fmt=_fmt,
        ci=_ci,
        short=display,
        level=f"{level:.0%}" if isinstance(level, (int, float)) else "",
        images=[(n.removesuffix(".png"), base64.b64encode(d).decode("ascii")) for n, d in pngs.items()],
        series=list(shown),
        conventions=first.get("conventions", []),
        notes=footnotes(results_by_model),
        pages=pages or [],
        runs={name: run_fields(v) for name, v in (runs or {}).items()},
        kinds={n: (kinds or {}).get(n) or (kinds or {}).get(n.split("|")[0])
               or ("baseline" if n.startswith("baseline:") else "") for n in results_by_model},
        aliases=aliases,
        alias_labels=ALIAS_LABELS,
        alias_labels_json=jinja2.utils.markupsafe.Markup(json.dumps(ALIAS_LABELS)),
        decisions_html=jinja2.utils.markupsafe.Markup(decisions_html(promotion)),
        bests=bests,
        split_notes=split_notes or [],
        made_by=made_by,
        empty=dict(empty or {}),
        path=shown_path or str((out / "index.html").resolve()),
        ports_script=ports_script,
        promotion_script=promotion_script,
    )
    path = out / "index.html"
    path.write_text(html, encoding="utf-8")
    log.info("evaluation report written to %s", path)
    return path
