"""How the evaluation pages show the promotion decisions: the list of decisions as HTML, and the
script file beside the report that carries them.

The pages are written before promotion decides in the same run, so they read the decisions when
they are opened, from promotion.js (PROMOTION_SCRIPT, the global PROMOTION_GLOBAL), which
pipelines.promotion.summary writes afterwards. The decisions arrive here as plain data
(`PromotionSummary.to_json()`), so the pages need nothing of the promotion package.

    decisions_html(summary.to_json())    # the <li> items of the report's "decisions" list
"""

from __future__ import annotations

from typing import Any

from pipelines.evaluation.forecaster_table import short_name

PROMOTION_SCRIPT = "promotion.js"  # beside the report's in-distribution page
PROMOTION_GLOBAL = "KERNELCAST_PROMOTION"

_DECISIONS = """{% for d in decisions %}<li>{% if d.version is none %}<b>@{{ d.alias }}</b>: none \
({{ d.outcome }}: {{ d.reason }}){% else %}For {{ d.purpose }}: <b>{{ short(d.ref) }}</b> ({{ d.kind or "?" }}) \
<span class="badge {{ d.alias }}">@{{ d.alias }}</span> Brier \
{{ "%.3f"|format(d.brier) if d.brier is not none else "not scored" }}{% if d.n_pairs %} on the \
{{ "{:,}".format(d.n_pairs) }} {{ d.split }} pairs all versions forecast{% endif %} ({{ d.outcome }}){% endif %}</li>
{% else %}<li>No promotion decision yet: no version is a champion.</li>{% endfor %}"""


def decisions_html(promotion: dict[str, Any] | None) -> str:
    """The decisions of a summary (`PromotionSummary.to_json()`) as HTML list items, escaped.

    >>> decisions_html(None)
    '<li>No promotion decision yet: no version is a champion.</li>'
    """
    import jinja2

    template = jinja2.Environment(autoescape=True).from_string(_DECISIONS)
    return template.render(decisions=(promotion or {}).get("decisions", []), short=short_name).strip()
