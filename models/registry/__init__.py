"""The surrogate in MLflow: `versions` (log, register, alias, resolve, load, lineage), `tracking`
(the runs of training and evaluation as MLflow users expect them), `lifecycle` (train-or-reuse,
challengers, the champion)."""
