"""The surrogate in MLflow: `versions` (log, register, alias, resolve, load, lineage), `tracking`
(the runs of training and evaluation as MLflow users expect them), `lifecycle` (train-or-reuse,
challengers, the champion)."""

# The registered model every kind of forecaster is a version of, and the one its held-out task and
# style twins go to (scored, never promoted): the one definition of both names.
SURROGATE_MODEL = "kernelcast-surrogate"
HELD_OUT_MODEL = f"{SURROGATE_MODEL}-held-out"

# Artifact locations relative to the home (models.registry.home_artifacts resolves them): the
# scheme, the folder beside mlflow.db, and the location the project's experiments are created with.
HOME_SCHEME = "kernelcast-home"
ARTIFACTS_DIR = "mlartifacts"  # beside mlflow.db
HOME_ARTIFACT_ROOT = f"{HOME_SCHEME}:/{ARTIFACTS_DIR}"
