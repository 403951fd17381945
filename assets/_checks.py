"""The one shape every blocking data check here takes: offending ids, none allowed."""

import dagster as dg


def offending_ids_result(name: str, offending: list[str], asset_key: str | None = None) -> dg.AssetCheckResult:
    """An ERROR-severity check result that passes only when `offending` is empty; metadata
    shows the count, the threshold (0) and the first few ids."""
    return dg.AssetCheckResult(
        check_name=name,
        asset_key=asset_key,
        passed=not offending,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"value": len(offending), "threshold": 0, "offending": ", ".join(offending[:5]) or "none"},
    )
