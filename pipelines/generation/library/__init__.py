"""The library set: published kernels from public kernel libraries and model code, fetched and
assembled at run time, measured and forecast but never trained on.

The repository keeps only the manifest (manifest.toml: ids, source repository, commit, paths,
license) and our adapters (adapters/<id>.py, each giving the published function the task's
custom_kernel(data) contract). `python -m pipelines.generation.library build --repos DIR --out
FOLDER` reads the published files from fetched copies of their repositories and writes the
modules, a KERNEL_BATCH_SCHEMA batch and the entry -> kernel id map into FOLDER, which must lie
outside the repository (docs/library-set.md).

    manifest.py   Entry and load_manifest (manifest.toml)
    repos.py      finds a fetched repository and reads a file at a commit (git show)
    assemble.py   one module from the published files and the adapter (imports rewritten)
    build.py      build_set: the modules, kernels-library.parquet, library-manifest.json
    check.py      check_set: the built modules on their tasks' correctness cases (CPU or GPU)

Submodules are imported explicitly: `check` runs on a bare GPU host, without pyarrow.
"""
