"""Promotion of a registered surrogate version, in one place: `rule` (challenger -> champion, one
explicit rule over the splits) and `scores` (every registered version scored on the same pairs)."""
