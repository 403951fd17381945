"""Artifact locations relative to the home: the `kernelcast-home:` scheme, an MLflow artifact
repository plugin.

MLflow writes an artifact location once, when the experiment, run or logged model is created,
and a `file://` location is an absolute path (`resolve_uri_if_local`); MLflow has no API to
change it afterwards. A home copied or moved elsewhere would then read and write the old folder.
So the project's experiments are created with the location `kernelcast-home:/mlartifacts`; MLflow
derives every run's and logged model's location from it (`kernelcast-home:/mlartifacts/<exp>/<run>
/artifacts`, `.../models/<model id>/artifacts`), and this repository resolves the path against the
folder of the sqlite store in use when the location is opened: the same rows read the right files
wherever the home lies.

MLflow finds the scheme through the plugin entry point `mlflow.artifact_repository` (pyproject);
`register()` adds it in a process whose installed metadata predates the entry point.

Which store: the tracking URI MLflow hands the repository, else the process's (`mlflow.
get_tracking_uri()`, which every caller here sets; `kernelcast ui` sets MLFLOW_TRACKING_URI for
the MLflow server it starts). Only a sqlite store has a home.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from mlflow.exceptions import MlflowException
from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

from models.registry import HOME_ARTIFACT_ROOT
from models.registry import HOME_SCHEME as SCHEME

__all__ = ["HOME_ARTIFACT_ROOT", "HomeArtifactRepository", "register", "resolve", "store_home"]


def store_home(tracking_uri: str | None) -> Path | None:
    """The folder of a `sqlite:///` store's database (the home), None for any other store.

    >>> str(store_home("sqlite:////tmp/home/mlflow.db"))
    '/tmp/home'
    >>> store_home("http://127.0.0.1:5000") is None
    True
    """
    if not tracking_uri or not tracking_uri.startswith("sqlite:///"):
        return None
    return Path(tracking_uri[len("sqlite:///"):]).parent


def resolve(artifact_uri: str, tracking_uri: str | None) -> str:
    """The `file://` URI a `kernelcast-home:` location names in the store's home.

    >>> resolve("kernelcast-home:/mlartifacts/1/abc/artifacts", "sqlite:////srv/home/mlflow.db")
    'file:///srv/home/mlartifacts/1/abc/artifacts'

    Raises:
        MlflowException: the store is not a sqlite file (no home to resolve against), or the
            location climbs out of the home.
    """
    home = store_home(tracking_uri)
    if home is None:
        raise MlflowException(f"{artifact_uri} lies in a kernelcast home, but the tracking store "
                              f"{tracking_uri or '(none set)'} is not a home's sqlite:/// store")
    relative = PurePosixPath(urlparse(artifact_uri).path.lstrip("/"))
    if ".." in relative.parts:
        raise MlflowException(f"{artifact_uri} points outside the home")
    return (home.resolve() / relative).as_uri()


class HomeArtifactRepository(LocalArtifactRepository):
    """A local artifact repository whose root is a path under the home of the store in use."""

    def __init__(self, artifact_uri: str, tracking_uri: str | None = None, registry_uri: str | None = None) -> None:
        import mlflow

        self.home_uri = artifact_uri  # kept: what the store holds
        super().__init__(resolve(artifact_uri, tracking_uri or mlflow.get_tracking_uri()), tracking_uri, registry_uri)


def register() -> None:
    """Make the scheme known to MLflow in this process (a no-op where the entry point did it)."""
    from mlflow.store.artifact import artifact_repository_registry as registry

    if SCHEME not in registry.get_registered_artifact_repositories():
        # The registry's own hook for plugins, called directly where the package's installed
        # entry points predate this scheme.
        registry._artifact_repository_registry.register(SCHEME, HomeArtifactRepository)
