"""Hardware partitions: one dynamic partition per GPU type (e.g. 'nvidia-h200-sm90')."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from orchestration.settings import Settings

HARDWARE_PARTITIONS = dg.DynamicPartitionsDefinition(name="hardware")


def result_files(settings: Settings) -> list[Path]:
    """Measurement result files shipped under data/measurements and waiting in the inbox."""
    files: list[Path] = []
    for root in (settings.measurements_dir, settings.inbox):
        if root.exists():
            files += sorted(p for p in root.rglob("*.parquet") if p.is_file())
    return files


def hardware_of_file(path: Path) -> str | None:
    """The hardware_id of a results file, or None for kernel files / unreadable files."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        if "hardware_id" not in pf.schema_arrow.names:
            return None
        col = pf.read(columns=["hardware_id"]).column(0).unique().to_pylist()
        return col[0] if len(col) == 1 else None
    except Exception:  # a corrupt file is reported by the ingest, not here
        return None


def discover_hardware_partitions(settings: Settings) -> list[str]:
    keys = {h for f in result_files(settings) if (h := hardware_of_file(f))}
    try:
        import torch

        if torch.cuda.is_available() and settings.profiling.measure_on_cuda:
            from warehouse.formats import hardware_id

            keys.add(hardware_id(torch.cuda.get_device_name(), torch.cuda.get_device_capability()))
    except Exception:
        pass
    return sorted(keys)
