"""Promotion of a registered surrogate version, in one place: `rule` (challenger -> champion, one
explicit rule over the splits), `scores` (every registered version scored on the same pairs) and
`apply` (the `model_promotion` asset's one call: score, decide, move the aliases, record both
decisions)."""
