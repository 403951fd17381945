"""The cross-hardware page of a dataset version's report: one section per target card.

For each card (pipelines.evaluation.card_study.CardStudy): the sizes of its pairs, a table
per setting (zero shot, calibrated on n of its pairs, fitted on n of its pairs) with Brier
[95% interval], CRPS, NLL, accuracy, off-by-one and ECE of each forecaster, the reference card's
in-distribution and external Brier of the same forecasters beside them, the curve of Brier
against the number of the card's pairs used (a PNG, matplotlib), and the bin agreement of the
kernels measured on both cards, per task. Written under <reports>/<version>/cross_hardware/:
index.html, curve-<card>.png, cross_hardware.json (what `kernelcast report` and the docs read).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from pipelines.evaluation.figures import _png, plt

FOLDER = "cross_hardware"
SUMMARY_FILE = "cross_hardware.json"
SETTING_TITLES = {"zero_shot": "zero shot: the reference card's versions as they are",
                  "calibrated": "calibrated: the reference card's versions, recalibrated on the first {n} pairs of the card",
                  "fitted": "fitted: the classical kinds fitted on the first {n} pairs of the card"}
COLUMNS = (("n", "pairs"), ("brier", "Brier"), ("crps", "CRPS"), ("nll", "NLL"), ("accuracy", "accuracy"),
           ("off_by_one", "off-by-one"), ("ece", "ECE"))


def fmt(value: Any) -> str:
    """A table cell: 4 decimals for a float, '–' for nothing.

    >>> fmt(0.123456), fmt(None), fmt(12)
    ('0.1235', '–', '12')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def setting_title(name: str) -> str:
    """The heading of a setting (`calibrated@300` -> its sentence with n = 300 pairs).

    >>> setting_title("fitted@all")
    'fitted: the classical kinds fitted on the first all pairs of the card'
    """
    kind, _, n = name.partition("@")
    return SETTING_TITLES.get(kind, name).format(n=n)


def curve_figure(study: Mapping[str, Any]) -> bytes:
    """Brier against the card's pairs used: one line per (setting, kind) of the calibrated and
    fitted settings, their zero-shot point at 0; the reference card's in-distribution Brier of
    each kind as a dotted level."""
    fig, ax = plt.subplots(figsize=(9.5, 4.5), layout="constrained")
    pool = max(study.get("pool_pairs", 0), 1)
    lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
    zero = {r["forecaster"]: r["brier"] for r in study["curve"] if r["setting"] == "zero_shot"}
    for r in study["curve"]:
        if r["setting"] == "zero_shot":
            continue
        lines.setdefault((r["setting"], r["forecaster"]), []).append((r["pairs"], r["brier"]))
    colours = {}
    for (setting, kind), pts in sorted(lines.items()):
        if setting == "calibrated" and kind in zero:
            pts = [(0, zero[kind]), *pts]
        pts.sort()
        colour = colours.setdefault(kind, f"C{len(colours)}")
        ax.plot([max(x, 1) for x, _ in pts], [y for _, y in pts], marker="o" if setting == "fitted" else "s",
                ls="-" if setting == "fitted" else "--", color=colour, label=f"{setting} {kind}")
    for kind, ref in sorted((study.get("reference_scores") or {}).items()):
        if ref.get("in_distribution") is not None:
            ax.axhline(ref["in_distribution"], ls=":", lw=1, color=colours.get(kind, "grey"),
                       label=f"{kind}: in distribution on {study['reference_hardware']}")
    ax.axhline(0.4375, ls="-", lw=0.8, color="grey", label="uniform")
    ax.set_xscale("log")
    ax.set(xlim=(0.8, pool * 1.3), xlabel=f"pairs of {study['hardware_id']} used (1 = none: zero shot)",
           ylabel="Brier (halved), eval pairs of the card",
           title=f"{study['hardware_id']}: Brier vs pairs of the card")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the data, never over it
    return _png(fig)


_TEMPLATE = jinja2.Template(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th:first-child,td:first-child{text-align:left}
.ci{color:#777;font-size:11px}
img{max-width:100%;margin:0.5em}
</style></head><body>
<h1>{{ title }}</h1>
<p class="ci">This report: {{ path }}{% if made_by %}; made by Dagster run <a href="{{ made_by[1] }}">{{ made_by[0] }}</a>{% endif %}</p>
{% if not studies %}<p>No card but the reference card in this dataset version.</p>{% endif %}
{% for s in studies %}
<h2>{{ s.hardware_id }} (reference card {{ s.reference_hardware }})</h2>
<p>{{ s.eval_pairs }} eval pairs (bin-balanced per task; {{ s.learned_left_out }} candidates the reference card's
forecasters learned from left out), {{ s.pool_pairs }} pairs to calibrate or fit on, in a bin-balanced order.
Forecasters: {% for role, kinds in s.models.items() %}{{ role }}: {% for k, ref in kinds.items() %}{{ k }} = {{ ref }}{% if not loop.last %}, {% endif %}{% endfor %}{% if not loop.last %}; {% endif %}{% endfor %}.</p>
{% for note in s.notes %}<p class="ci">{{ note }}</p>{% endfor %}
{% if s.reference_scores %}<h3>The same forecasters on {{ s.reference_hardware }}</h3>
<table><tr><th>forecaster</th><th>in distribution Brier</th><th>external Brier</th></tr>
{% for k, r in s.reference_scores.items() %}<tr><td>{{ k }}</td><td>{{ fmt(r.get("in_distribution")) }}</td><td>{{ fmt(r.get("external")) }}</td></tr>{% endfor %}</table>{% endif %}
<img alt="Brier vs pairs" src="data:image/png;base64,{{ s.curve_png }}">
{% for name, part in s.settings.items() %}
<h3>{{ setting_title(name) }}</h3>
<table><tr><th>forecaster</th>{% for _, label in columns %}<th>{{ label }}</th>{% endfor %}</tr>
{% for f, r in part.items() %}<tr><td>{{ f }}</td>{% for key, _ in columns %}<td>{{ fmt(r.get(key)) }}{% if key == "brier" and r.get("brier_ci") %}<br><span class="ci">[{{ fmt(r["brier_ci"][0]) }}, {{ fmt(r["brier_ci"][1]) }}]</span>{% endif %}</td>{% endfor %}</tr>
{% endfor %}</table>{% endfor %}
<h3>Bin agreement of the kernels correct on both cards ({{ s.agreement.n or 0 }} kernels)</h3>
{% if s.agreement.rows %}<table><tr><th>task</th><th>kernels</th><th>same bin</th><th>within one bin</th><th>mean shift (bins)</th><th>median speedup ratio</th></tr>
{% for r in s.agreement.rows %}<tr><td>{{ r.task }}</td><td>{{ r.n }}</td><td>{{ fmt(r.same) }}</td><td>{{ fmt(r.within_one) }}</td><td>{{ fmt(r.mean_shift) }}</td><td>{{ fmt(r.median_ratio) }}</td></tr>{% endfor %}</table>
<p class="ci">Each kernel against its task's reference on each card; the shift and the ratio are the card's over the reference card's.</p>
{% else %}<p>No kernel is correct on both cards.</p>{% endif %}
{% endfor %}
</body></html>
""")


def write_cross_hardware_report(studies: Sequence[Mapping[str, Any]], out_dir: str | Path, version: str,
                                made_by: tuple[str, str] | None = None) -> Path:
    """Write the page, the curve PNGs and the summary JSON of a version's card studies.

    Args:
        studies: `CardStudy.to_dict()` of each target card, with `reference_scores` (kind ->
            {"in_distribution", "external"}: the reference card's Brier of the same forecasters).
        out_dir: the version's report folder (the page goes in its `cross_hardware` folder).
        version: the dataset version (the title).
        made_by: (Dagster run id, its URL) of the run writing the page.
    Returns:
        Path of the page (index.html).
    """
    out = Path(out_dir) / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    shown = []
    for study in studies:
        png = curve_figure(study)
        (out / f"curve-{study['hardware_id']}.png").write_bytes(png)
        shown.append({**study, "curve_png": base64.b64encode(png).decode()})
    page = out / "index.html"
    page.write_text(_TEMPLATE.render(title=f"kernelcast evaluation, dataset {version}, cross-hardware", path=str(page),
                                     studies=shown, fmt=fmt, setting_title=setting_title, columns=COLUMNS,
                                     made_by=made_by))
    (out / SUMMARY_FILE).write_text(json.dumps({"dataset_version": version, "page": str(page), "cards": list(studies)},
                                               indent=1, default=str))
    return page


def headline(study: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a card's study is quoted by: zero-shot, calibrated (on the largest size of at
    most 300 pairs) and fitted (on all) Brier of the best forecaster of each, the reference card's
    in-distribution Brier of the same kind, and the share of kernels in the same bin on both cards.

    >>> s = {"hardware_id": "b", "settings": {"zero_shot": {"cost_model": {"n": 3, "brier": 0.4}},
    ...      "calibrated@300": {"cost_model": {"n": 3, "brier": 0.3}}}, "reference_scores":
    ...      {"cost_model": {"in_distribution": 0.29}}, "agreement": {"rows": [{"task": "all", "same": 0.9}]}}
    >>> h = headline(s); h["calibrated"], h["calibrated_gap"], h["same_bin"]
    (('cost_model', 0.3, 300), 0.01, 0.9)
    """
    def best(setting: str) -> tuple[str, float] | None:
        got = {f: r["brier"] for f, r in (study["settings"].get(setting) or {}).items()
               if not f.startswith("baseline:") and r.get("n")}
        return min(got.items(), key=lambda kv: (kv[1], kv[0])) if got else None

    sizes = sorted(int(s.split("@")[1]) for s in study["settings"] if s.startswith("calibrated@")
                   and s.split("@")[1].isdigit() and int(s.split("@")[1]) <= 300)
    calibrated = best(f"calibrated@{sizes[-1]}") if sizes else None
    ref = study.get("reference_scores") or {}
    gap = None
    if calibrated and (ref.get(calibrated[0]) or {}).get("in_distribution") is not None:
        gap = round(calibrated[1] - ref[calibrated[0]]["in_distribution"], 4)
    same = next((r["same"] for r in (study.get("agreement") or {}).get("rows", []) if r["task"] == "all"), None)
    return {"hardware_id": study["hardware_id"], "zero_shot": best("zero_shot"),
            "calibrated": (*calibrated, sizes[-1]) if calibrated else None, "calibrated_gap": gap,
            "fitted": best("fitted@all"), "same_bin": same}
