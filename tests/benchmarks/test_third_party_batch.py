"""The batch of third-party kernels: one row per file, content-addressed, no generator metadata."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from benchmarks.third_party_batch import EXTERNAL_PREFIX, external_rows, main
from warehouse.ids import kernel_id

KERNEL = "import torch\n\ndef custom_kernel(data):\n    (x,) = data\n    return torch.softmax(x.float(), -1).to(x.dtype)\n"


def _folder(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "softmax").mkdir()
    (tmp_path / "softmax" / "someone_fused.py").write_text(KERNEL)
    (tmp_path / "softmax" / "copy.py").write_text(KERNEL + "\n\n")  # the same kernel once normalised
    (tmp_path / "rms_norm").mkdir()
    (tmp_path / "rms_norm" / "lib.py").write_text(KERNEL.replace("softmax", "rsqrt"))
    return tmp_path


def test_rows_are_content_addressed_and_carry_no_metadata(tmp_path):
    rows = external_rows(_folder(tmp_path))
    assert [(r["task"], r["generator"]) for r in rows] == [
        ("rms_norm", EXTERNAL_PREFIX + "lib"), ("softmax", EXTERNAL_PREFIX + "copy"),
        ("softmax", EXTERNAL_PREFIX + "someone_fused")]
    assert rows[2]["kernel_id"] == kernel_id(KERNEL) == rows[1]["kernel_id"]
    assert all(r["algorithm"] is None and r["knobs_json"] is None and r["parent_kernel_id"] is None for r in rows)


def test_command_writes_one_row_per_distinct_kernel_and_the_names(tmp_path):
    folder = _folder(tmp_path / "ext")
    out, names = tmp_path / "b.parquet", tmp_path / "names.json"
    assert main([str(folder), "--out", str(out), "--names", str(names)]) == 0
    table = pq.read_table(out)
    assert table.num_rows == 2
    assert pq.ParquetFile(out).metadata.row_group(0).column(0).compression == "ZSTD"
    assert json.loads(names.read_text())[kernel_id(KERNEL)].startswith("softmax/")


@pytest.mark.parametrize("make", ["unknown_task", "empty", "missing"])
def test_bad_folders_are_one_line_and_exit_2(tmp_path, make, capsys):
    folder = tmp_path / "ext"
    if make == "unknown_task":
        (folder / "not_a_task").mkdir(parents=True)
        (folder / "not_a_task" / "k.py").write_text(KERNEL)
    elif make == "empty":
        folder.mkdir()
    assert main([str(folder), "--out", str(tmp_path / "b.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    assert not (tmp_path / "b.parquet").exists()
