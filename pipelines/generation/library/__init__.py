"""The library set: published kernels from public kernel libraries and model code, fetched and
assembled at run time, measured and forecast but never trained on.

The repository keeps only the manifest (manifest.toml: ids, source repository, commit, paths,
license) and our adapters (adapters/<id>.py, each giving the published function the task's
custom_kernel(data) contract). `python -m pipelines.generation.library build --repos DIR --out
FOLDER` reads the published files from fetched copies of their repositories and writes the
modules, a KERNEL_BATCH_SCHEMA batch and the entry -> kernel id map into FOLDER, which must lie
outside the repository (docs/library-set.md).
"""

from pipelines.generation.library.build import BuildReport, build_set, check_outside
from pipelines.generation.library.manifest import Entry, load_manifest

__all__ = ["BuildReport", "Entry", "build_set", "check_outside", "load_manifest"]
