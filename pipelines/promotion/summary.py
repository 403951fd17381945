"""What the newest promotion decisions say, for whoever reads results: which version each champion
alias names, its Brier on how many pairs of which split, and which aliases sit on which version.

    summary = read_summary(warehouse_path)
    summary.lines()                      # what `kernelcast report` and the end of a run print
    summary.aliases                      # {"models:/kernelcast-surrogate/3": ["champion", ...]}
    write_promotion_script(report_dir, summary)   # promotion.js beside the HTML report

The decisions are read from DuckDB (`promotion_decisions`, `promotion_scores`, written by the
model_promotion asset). The HTML report is written before promotion decides in the same run, so
model_promotion writes promotion.js beside the report afterwards, and the report's pages mark the
champions from it (how a page shows the decisions, and the file's name: pipelines.evaluation.decisions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.registry import SURROGATE_MODEL
from pipelines.evaluation.decisions import PROMOTION_GLOBAL, PROMOTION_SCRIPT, decisions_html

# What each champion alias is for, in a reader's words (pipelines.promotion.rule decides them).
ALIAS_PURPOSE = {
    "champion": "kernels like the ones the platform generates",
    "champion-external": "kernel files people write (kernelcast forecast and the search hooks use it)",
}


@dataclass(frozen=True)
class Decision:
    """The newest decision of one champion alias."""

    alias: str
    version: int | None  # the version the alias names after it (None: no champion)
    kind: str | None
    brier: float | None  # that version's Brier on the decision's common pairs
    n_pairs: int | None
    split: str
    outcome: str
    reason: str

    @property
    def ref(self) -> str | None:
        return None if self.version is None else f"models:/{SURROGATE_MODEL}/{self.version}"

    def line(self) -> str:
        """One line: the version, its kind, its Brier on how many pairs of which split, the outcome.

        >>> Decision("champion", 3, "ensemble", 0.3504, 12, "in_distribution", "promoted", "").line()
        '@champion: surrogate/3 (ensemble), Brier 0.350 on 12 pairs of in_distribution; promoted'
        """
        if self.version is None:
            return f"@{self.alias}: none ({self.outcome}: {self.reason})"
        scored = (f"Brier {self.brier:.3f} on {self.n_pairs:,} pairs" if self.brier is not None and self.n_pairs
                  else "not scored")
        return f"@{self.alias}: surrogate/{self.version} ({self.kind or '?'}), {scored} of {self.split}; {self.outcome}"


@dataclass(frozen=True)
class PromotionSummary:
    decisions: list[Decision] = field(default_factory=list)
    aliases: dict[str, list[str]] = field(default_factory=dict)  # model ref -> aliases on it

    def lines(self) -> list[str]:
        return [d.line() for d in self.decisions]

    def to_json(self) -> dict[str, Any]:
        return {"decisions": [{**d.__dict__, "ref": d.ref, "line": d.line(), "purpose": ALIAS_PURPOSE.get(d.alias, "")}
                              for d in self.decisions],
                "aliases": self.aliases}


def read_summary(warehouse_path: str | Path, model_name: str = SURROGATE_MODEL) -> PromotionSummary:
    """The newest decision of each champion alias and the aliases they left (champions and
    challengers); an empty summary before the first decision or without a warehouse."""
    from warehouse.db import connect
    from warehouse.promotions import (
        DECISION_ALIASES,
        read_promotion_decisions,
        read_promotion_scores,
    )

    if not Path(warehouse_path).exists():
        return PromotionSummary()
    decisions, aliases = [], {}
    with connect(warehouse_path, read_only=True) as con:
        for alias in DECISION_ALIASES:
            found = read_promotion_decisions(con, model_name, alias)
            if found.is_empty():
                continue
            d = found.row(0, named=True)
            champion, challenger = d.get("champion_after"), d.get("challenger_after")
            scores = {r["model_version"]: r for r in read_promotion_scores(con, d["decision_id"]).to_dicts()}
            for version, name in ((champion, alias), (challenger, alias.replace("champion", "challenger"))):
                if version is not None:
                    aliases.setdefault(f"models:/{model_name}/{version}", []).append(name)
            sc = (scores.get(str(champion)) or {}) if champion is not None else {}
            decisions.append(Decision(alias, None if champion is None else int(champion), sc.get("kind"),
                                      sc.get("brier"), sc.get("n_pairs"), d.get("decided_on_split") or "in_distribution",
                                      d["outcome"], d["reason"]))
    return PromotionSummary(decisions, aliases)


def promotion_script(summary: PromotionSummary) -> str:
    """promotion.js: the summary, and its decisions as HTML, as the report's pages read it.

    >>> promotion_script(PromotionSummary()).split(" = ")[0]
    'window.KERNELCAST_PROMOTION'
    """
    data = summary.to_json()
    # "</" never closes the script element the browser loads it into
    text = json.dumps({**data, "html": decisions_html(data)}).replace("</", "<\\/")
    return f"window.{PROMOTION_GLOBAL} = {text};\n"


def write_promotion_script(report_dir: str | Path, summary: PromotionSummary) -> Path | None:
    """promotion.js in the report folder of a dataset version; None when there is no report."""
    folder = Path(report_dir)
    if not folder.is_dir():
        return None
    path = folder / PROMOTION_SCRIPT
    path.write_text(promotion_script(summary), encoding="utf-8")
    return path
