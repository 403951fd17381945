"""The command line of the code-reading LLM's job: build it from the warehouse, ingest what a GPU
host's run sent back (docs/llm-surrogate.md).

    python -m orchestration.code_bundle_cli build-bundle --out .gpu-batches/llm-bundle [--warehouse P]
    python -m orchestration.code_bundle_cli embed-head OUT --job JOB [--base-model smollm2]
    python -m orchestration.code_bundle_cli ingest OUT --job JOB [--into RUN_DIR] [--register] [--adapter]

The job is models/training/gpu_host/job.py's folder of kind "code" (`--bundle` is `--job`'s older
name). The domain code is pipelines.surrogates.code_bundle (the job), remote_results (the one
ingest of a host's output) and registration; this module adds the settings' defaults (warehouse,
data folder, MLflow store), which live on the orchestration floor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestration.settings import load_settings
from pipelines.surrogates.code_bundle import build_bundle
from pipelines.surrogates.registration import register_variants
from pipelines.surrogates.remote_results import JobError, ingest
from pipelines.surrogates.roles import DEFAULT_HELD_OUT_TASK


def ingest_cli(args: Any) -> int:
    """The `ingest` command."""
    settings = load_settings(None)
    into = Path(args.into) if args.into else settings.data_dir / settings.surrogate.committed_run
    try:
        summary = ingest(args.results, args.job, into, adapter=args.adapter)
    except JobError as e:
        print(f"error: {e}")
        return 2
    print(f"{summary['forecasts']} forecasts of {', '.join(summary['variants'])} of {summary['dataset_version']} "
          f"-> {summary['into']}" + "".join(f"; adapter adapters/{name}" for name in summary["adapters"]))
    for variant, name in summary["head_files"].items():
        print(f"  {variant}: head file {name}")
    if args.register:
        from models.registry.tracking import prepare_store
        from pipelines.forecasting.embed import log_embed_head_model
        from warehouse.db import connect

        prepare_store(settings.mlflow_uri)
        with connect(settings.warehouse_path) as con:
            versions = register_variants(con, settings.mlflow_uri, settings.data_dir, into, Path(args.results),
                                         summary["variants"], settings.surrogate.base_model,
                                         head_logger=log_embed_head_model)
        print("registered: " + ", ".join(f"{k} v{v}" for k, v in versions.items()))
    return 0


def _warehouse(path: str | None) -> Path:
    if path:
        return Path(path)
    return load_settings(None).warehouse_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestration.code_bundle_cli", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-bundle", help="write the code-reading LLM's job of a dataset version")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--warehouse", default=None, help="DuckDB file (default: the settings' warehouse)")
    b.add_argument("--version", default=None, help="dataset version (default: the newest)")
    b.add_argument("--held-out-task", default=DEFAULT_HELD_OUT_TASK)
    e = sub.add_parser("embed-head", help="fit the boosted code-embed variants on a host run's embeddings.parquet")
    e.add_argument("results", type=Path, help="the OUT folder the host run wrote (its forecasts and metrics grow)")
    e.add_argument("--job", "--bundle", dest="job", required=True, type=Path, help="the job folder the host ran")
    e.add_argument("--base-model", default=None,
                   help="the base model the host run read with (default: the settings' surrogate.base_model)")
    i = sub.add_parser("ingest", help="turn a host run's output into a committed run folder and register it")
    i.add_argument("results", type=Path, help="the OUT folder the host run wrote")
    i.add_argument("--job", "--bundle", dest="job", required=True, type=Path, help="the job folder the host ran")
    i.add_argument("--into", default=None, type=Path,
                   help="committed run folder (default: the settings' surrogate.committed_run under the data folder)")
    i.add_argument("--register", action="store_true", help="also register every variant in MLflow (settings' home)")
    i.add_argument("--adapter", action="store_true",
                   help="also keep code-lora's adapter (~5 MB) in the run folder (default: its forecasts only)")
    args = parser.parse_args(argv)
    from warehouse.db import connect

    try:
        if args.command == "build-bundle":
            path = _warehouse(args.warehouse)
            if not path.exists():
                raise ValueError(f"no warehouse at {path}: run `kernelcast run` first (or pass --warehouse)")
            with connect(path, read_only=True) as con:
                meta = build_bundle(con, args.out, args.version, args.held_out_task)
            size = sum(f.stat().st_size for f in Path(args.out).iterdir()) / 2**20
            print(f"bundle of {meta['dataset_version']} in {args.out} ({size:.1f} MiB): "
                  + ", ".join(f"{k} {v}" for k, v in meta["counts"].items()))
            return 0
        if args.command == "embed-head":
            from pipelines.surrogates.code_embed import add_embed_variants

            summary = add_embed_variants(args.results, args.job, args.base_model or load_settings(None).surrogate.base_model)
            print("added: " + ", ".join(summary["variants"]))
            for variant, name in summary["head_files"].items():
                print(f"  {variant}: forecasts new pairs (its head: {name})")
            for variant, why in summary["not_forecasting_new_pairs"].items():
                print(f"  {variant}: answers only the pairs of its run: {why}")
            for variant, scores in summary["ablation"].items():
                for inputs, by_role in scores.items():
                    print(f"  {variant:22s} {inputs:38s} " + "  ".join(f"{r} {b:.4f}" for r, b in by_role.items()))
            return 0
        return ingest_cli(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
