"""The harness benchmark's CPU-testable parts: the kernel draw, the protocol comparison, the
submissions table, and the whole benchmark (benchmarks.harness_bench) on the CPU
(Triton interpreter) with a GPU MODE-style submission written for these tests."""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks import harness_bench
from benchmarks import protocol_bench as bench
from warehouse.formats import RESULT_SCHEMA

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "measurements" / "h200"


def test_the_draw_is_deterministic_spread_and_measured_correct_before():
    first = bench.draw_kernels(DATA, 100)
    assert [r["kernel_id"] for r in first] == [r["kernel_id"] for r in bench.draw_kernels(DATA, 100)]
    counts = collections.Counter(r["task"] for r in first)
    assert len(first) == 100 and counts["trimul"] == 2 and set(counts.values()) == {2, 12, 13} and len(counts) == 9
    ok = bench.measured_ok(sorted(DATA.glob("results-*.parquet")))
    assert all(r["kernel_id"] in ok and "def custom_kernel" in r["source"] for r in first)
    other = bench.draw_kernels(DATA, 100, seed=1)
    assert {r["kernel_id"] for r in other} != {r["kernel_id"] for r in first}


def _row(kid, task, status="ok", kc=(1.0, 2.0), speedup=2.0, cases=("a", "b")):
    return {"kernel_id": kid, "task": task, "status": status, "failure_kind": None if status == "ok" else status,
            "error": None, "case_ids": list(cases), "kernel_median_ms": list(kc), "kernel_mean_ms": list(kc),
            "speedup": speedup}


def test_compare_takes_ratios_of_kernels_correct_under_both():
    kc = [_row("k1", "t", kc=(1.0, 2.0), speedup=3.0), _row("k2", "t", kc=(2.0, 2.0), speedup=1.0),
          _row("k3", "u", status="incorrect")]
    gm = [_row("k1", "t", kc=(2.0, 8.0), speedup=1.5), _row("k2", "t", kc=(2.0, 2.0), speedup=1.0),
          _row("k3", "u", kc=(1.0, 1.0))]
    c = bench.compare(kc, gm)
    # k1: sqrt(1/2 * 2/8) = 0.3536, k2: 1.0
    assert c["both_ok"] == 2 and c["time_ratio"]["median"] == pytest.approx((0.35355 + 1.0) / 2, rel=1e-4)
    assert c["speedup_ratio"]["p95"] <= 2.0 and c["disagree"] == ["k3"]
    assert c["status"]["kernelcast"] == {"ok": 2, "incorrect": 1}


def test_submissions_table_gives_gpu_modes_score():
    sub = bench.SUBMISSION_PREFIX + "x"
    table = bench.submissions_table([_row(sub, "trimul", kc=(1.0, 4.0))], [_row(sub, "trimul", status="crashed")])
    assert table[0]["submission"] == "x" and table[0]["kernelcast"]["score_us"] == pytest.approx(2000.0)
    assert table[0]["gpumode"]["status"] == "crashed"


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end_on_the_cpu(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(REPO / "tests" / "fixtures_kernels" / "gpumode" / "trimul_submission.py", subs)
    out = tmp_path / "out"
    code = harness_bench.main(["--out", str(out), "--device", "cpu", "--n", "2", "--tasks", "softmax,rms_norm",
                               "--submissions", str(subs), "--no-fault", "--deadline-s", "200"])
    res = capsys.readouterr()
    assert code == 0, res.err[-2000:]
    assert "kernel time kernelcast/gpumode: median" in res.out and "trimul_submission" in res.out
    files = {f.name for f in out.iterdir()}
    assert files == {"results-kernelcast.parquet", "results-gpumode.parquet", "submissions-kernelcast.parquet",
                     "submissions-gpumode.parquet", "bench-batch.parquet", "bench-summary.json"}
    for p in ("kernelcast", "gpumode"):
        t = pq.read_table(out / f"results-{p}.parquet")
        assert t.schema.equals(RESULT_SCHEMA) and t.num_rows == 2
        assert set(t.column("protocol").to_pylist()) == {p} and set(t.column("status").to_pylist()) == {"ok"}
        s = pq.read_table(out / f"submissions-{p}.parquet").to_pylist()
        assert len(s) == 1 and s[0]["status"] == "ok", s
    summary = json.loads((out / "bench-summary.json").read_text())
    assert summary["comparison"]["both_ok"] == 2 and summary["sandbox"]["gpumode"].startswith("sandbox: ")


def test_on_one_gpu_gpumode_measures_exactly_what_kernelcast_finished(tmp_path):
    import pyarrow as pa

    batch = tmp_path / "batch.parquet"
    pq.write_table(pa.table({"kernel_id": ["a", "b", "c"], "task": ["softmax"] * 3, "source": ["x", "y", "z"]}), batch)
    assert harness_bench._finished_batch(batch, tmp_path / "none.parquet", tmp_path / "g.parquet") == batch
    out = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"kernel_id": ["c", "a"]}), out)
    sub = harness_bench._finished_batch(batch, out, tmp_path / "g.parquet")
    assert pq.read_table(sub).column("kernel_id").to_pylist() == ["a", "c"]  # batch order, sources kept
    assert pq.read_table(sub).column("source").to_pylist() == ["x", "z"]


def test_parts_split_the_draw_and_only_the_first_carries_the_submissions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "one.py").write_text("def custom_kernel(data):\n    return data\n")
    seen, whole = [], [r["kernel_id"] for r in bench.interleave(bench.draw_kernels(DATA, 9))]
    for k in (1, 2, 3):
        args = harness_bench._parser().parse_args(["--out", "x", "--n", "9", "--submissions", str(subs), "--part", f"{k}/3"])
        out, work = tmp_path / f"o{k}", tmp_path / f"w{k}"
        out.mkdir(), work.mkdir()
        kernels, sub_rows, batch = harness_bench._batch(args, work, out)
        assert len(kernels) == 3 and len(sub_rows) == (1 if k == 1 else 0)
        ids = pq.read_table(batch).column("kernel_id").to_pylist()
        assert ids[: len(sub_rows)] == [bench.SUBMISSION_PREFIX + "one"] * len(sub_rows)
        seen += ids[len(sub_rows):]
    assert sorted(seen) == sorted(whole) and len(set(seen)) == 9  # disjoint, and together the whole draw
    for bad in ("0/2", "3/2", "half"):
        with pytest.raises(SystemExit):
            harness_bench._parser().parse_args(["--out", "x", "--part", bad])
    for bad in ("0", "1.5", "most"):
        with pytest.raises(SystemExit):
            harness_bench._parser().parse_args(["--out", "x", "--kernelcast-share", bad])


def _part_folder(path: Path, rows: dict[str, list[dict]], subs: dict[str, list[dict]], exit_code: int = 0) -> Path:
    import pyarrow as pa

    from tests.warehouse.test_warehouse_factory import result_row

    path.mkdir()
    tables = {}
    for p in harness_bench.PROTOCOLS:
        made = [dict(result_row(r["kernel_id"], task=r["task"], status=r["status"], speedup=r.get("speedup", 1.5),
                                failure_kind=None if r["status"] == "ok" else r["status"]), protocol=p)
                for r in rows[p] + subs[p]]
        table = pa.Table.from_pylist(made, schema=RESULT_SCHEMA)
        tables[p] = bench.split_rows(table)
    harness_bench._write_tables(path, tables)
    ids = {r["kernel_id"] for p in rows for r in rows[p] + subs[p]}
    pq.write_table(pa.table({"kernel_id": sorted(ids)}), path / "bench-batch.parquet")
    worker = {"exit": exit_code, "wall_s": 10.0, "sandbox": "sandbox: env"}
    (path / "bench-summary.json").write_text(json.dumps({
        "device": "cuda", "gpus": ["0"], "wall_s": 100.0, "kernels": len(rows["kernelcast"]),
        "submissions": [r["kernel_id"] for r in subs["kernelcast"]], "fault": None,
        "throughput": {p: {"measured": len(rows[p]) + len(subs[p]), "elapsed_s": 50.0} for p in harness_bench.PROTOCOLS},
        "sandbox": {p: "sandbox: env" for p in harness_bench.PROTOCOLS},
        "workers": {p: worker for p in harness_bench.PROTOCOLS}}))
    return path


def test_merge_reports_the_parts_as_one_run_and_refuses_overlap(tmp_path, capsys):
    sub = {"kernel_id": bench.SUBMISSION_PREFIX + "s", "task": "trimul", "status": "ok"}

    def k(kid, status="ok", speedup=1.5):
        return {"kernel_id": kid, "task": "softmax", "status": status, "speedup": speedup}

    a = _part_folder(tmp_path / "a", {"kernelcast": [k("k1"), k("k2", "incorrect")], "gpumode": [k("k1", speedup=1.0), k("k2")]},
                     {"kernelcast": [sub], "gpumode": [sub]})
    b = _part_folder(tmp_path / "b", {"kernelcast": [k("k3", speedup=3.0)], "gpumode": [k("k3", speedup=2.0)]},
                     {"kernelcast": [], "gpumode": []}, exit_code=1)
    out = tmp_path / "all"
    assert harness_bench.main(["--out", str(out), "--merge", str(a), str(b)]) == 1  # b's gpumode worker failed
    summary = json.loads((out / "bench-summary.json").read_text())
    c = summary["comparison"]
    assert c["both_ok"] == 2 and c["disagree"] == ["k2"] and c["speedup_ratio"]["median"] == pytest.approx(1.5)
    assert summary["kernels"] == 3 and summary["parts"] == ["a", "b"] and summary["workers"]["gpumode"]["exit"] == 1
    assert summary["throughput"]["kernelcast"] == {"measured": 4, "elapsed_s": 100.0, "kernels_per_hour": 144.0}
    assert [s["submission"] for s in summary["submission_results"]] == ["s"]
    assert pq.read_table(out / "results-gpumode.parquet").num_rows == 3
    assert "(2 kernels)" in capsys.readouterr().out

    again = _part_folder(tmp_path / "c", {"kernelcast": [k("k3")], "gpumode": []}, {"kernelcast": [], "gpumode": []})
    assert harness_bench.main(["--out", str(tmp_path / "x"), "--merge", str(a), str(b), str(again)]) == 2
    assert "more than one part" in capsys.readouterr().err
    assert harness_bench.main(["--out", str(tmp_path / "y"), "--merge", str(tmp_path / "nothing")]) == 2
    assert "not a finished harness_bench folder" in capsys.readouterr().err

    (b / "results-gpumode.parquet").write_bytes(b"PAR1 not parquet")  # a corrupt part: one line, nothing written
    assert harness_bench.main(["--out", str(tmp_path / "z"), "--merge", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot merge") and err.count("\n") == 1 and not (tmp_path / "z").exists()
    (b / "bench-summary.json").write_text("{")
    assert harness_bench.main(["--out", str(tmp_path / "z"), "--merge", str(a), str(b)]) == 2
    assert "JSONDecodeError" in capsys.readouterr().err and not (tmp_path / "z").exists()
