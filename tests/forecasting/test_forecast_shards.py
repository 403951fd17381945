"""The language models' forecasts split over GPUs: the shard split and the merge, pure.

The fan-out through Dagster (two shards on the multiprocess executor against one) is
tests/assets/test_surrogate_assets.py::test_forecasts_sharded_over_two_steps_equal_one_step, on the
tiny registered model of that module's graph.
"""

from __future__ import annotations

import hashlib

import polars as pl
import pytest

from pipelines.forecasting.llm_shards import (
    LlmJob,
    ShardCoverageError,
    expected_pairs,
    merge_shards,
    prompt_length,
    read_shard,
    split_jobs,
    write_shard,
)
from pipelines.sharding import balanced_shards


def _job(ref: str, n: int, seed: str = "") -> LlmJob:
    """A job of n pairs whose prompts differ in length as real ones do (hundreds to thousands of characters)."""
    lengths = [200 + int(hashlib.sha256(f"{seed}{i}".encode()).hexdigest()[:4], 16) % 4000 for i in range(n)]
    requests = tuple({"pair_id": f"pair-{i:03d}", "prompt": [{"role": "user", "content": "x" * length}]}
                     for i, length in enumerate(lengths))
    return LlmJob(ref, "compact", requests, name="kernelcast-surrogate", version=1)


@pytest.mark.parametrize("n_shards", [1, 2, 3, 8])
def test_split_is_complete_disjoint_balanced_and_deterministic(n_shards):
    jobs = [_job("models:/kernelcast-surrogate/1", 37), _job("models:/kernelcast-surrogate-held-out/1", 11, seed="h")]
    shards = split_jobs(jobs, n_shards)
    assert split_jobs(jobs, n_shards) == shards  # the same input, the same shards
    assert len(shards) == n_shards
    for job in jobs:
        held = [pid for shard in shards for s in shard if s.model_ref == job.model_ref for pid in s.pair_ids()]
        assert sorted(held) == sorted(job.pair_ids()) and len(held) == len(set(held))  # complete, disjoint
    # Balanced by forward-pass work over every model: no two shards differ by more than one prompt.
    loads = [sum(prompt_length(r["prompt"]) for s in shard for r in s.requests) for shard in shards]
    heaviest = max(prompt_length(r["prompt"]) for job in jobs for r in job.requests)
    assert max(loads) - min(loads) <= heaviest


def test_split_does_not_depend_on_the_input_order():
    job = _job("models:/kernelcast-surrogate/1", 20)
    shuffled = LlmJob(job.model_ref, job.style, tuple(reversed(job.requests)), name=job.name, version=job.version)
    by_id = [sorted(s.pair_ids()) for shard in split_jobs([job], 3) for s in shard]
    assert by_id == [sorted(s.pair_ids()) for shard in split_jobs([shuffled], 3) for s in shard]


def test_fewer_pairs_than_gpus_leaves_no_empty_shard():
    shards = split_jobs([_job("models:/kernelcast-surrogate/1", 2)], 4)
    assert [len(shard[0].requests) for shard in shards] == [1, 1]
    assert split_jobs([], 4) == []


def test_balanced_shards_refuses_what_it_cannot_split():
    with pytest.raises(ValueError, match="at least one shard"):
        balanced_shards(["a"], [1], 0)
    with pytest.raises(ValueError, match="unique key"):
        balanced_shards(["a", "a"], [1, 2], 2)
    with pytest.raises(ValueError, match="2 keys but 1 weights"):
        balanced_shards(["a", "b"], [1], 2)


def test_a_shard_file_reads_back_as_written(tmp_path):
    shard = split_jobs([_job("models:/kernelcast-surrogate/1", 5)], 2)[0]
    assert read_shard(write_shard(tmp_path / "shard-gpu0.json", shard)) == shard


def _rows(ref: str, pair_ids: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"pair_id": pair_ids, "model_ref": [ref] * len(pair_ids),
                         "p1": [1.0] * len(pair_ids)})


REF = "models:/kernelcast-surrogate/1"
EXPECTED = {REF: ["a", "b", "c", "d"]}


def test_merge_joins_shards_that_cover_every_pair_once():
    merged = merge_shards(EXPECTED, [_rows(REF, ["c", "a"]), _rows(REF, ["d", "b"])])
    assert merged["pair_id"].to_list() == ["a", "b", "c", "d"] and merged.height == 4
    job = _job(REF, 6)
    frames = [_rows(REF, s.pair_ids()) for shard in split_jobs([job], 3) for s in shard]
    assert merge_shards(expected_pairs([job]), frames).height == 6


@pytest.mark.parametrize("frames, message", [
    ([_rows(REF, ["a", "b"]), _rows(REF, ["d"])], "forecast shards miss 1 of 4 planned forecasts (first: pair c of "),
    ([_rows(REF, ["a", "b"]), _rows(REF, ["b", "c", "d"])], "forecast shards hold pair b of models:/kernelcast-surrogate/1 2 times"),
    ([_rows(REF, ["a", "b", "c", "d"]), _rows("base:smollm2", ["a"])], "1 forecasts nobody planned (first: pair a of base:smollm2)"),
    ([], "forecast shards miss 4 of 4 planned forecasts"),
], ids=["missing", "duplicate", "unplanned", "no-shards"])
def test_merge_refuses_a_missing_duplicate_or_unplanned_pair(frames, message):
    with pytest.raises(ShardCoverageError) as err:
        merge_shards(EXPECTED, frames)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_base_model_forecasts_the_same_in_two_shards_as_in_one(tmp_path):
    """Prompts built from a real warehouse, the tiny base model forecasting them on the CPU:
    two shards merged give the rows one shard gives, and those of forecast_pairs in one call."""
    import shutil

    from models.backends.transformers_backend import TransformersAnswerer
    from models.base_model import resolve_base_model
    from models.service import DEFAULT_HARDWARE
    from pipelines.forecasting.llm_shards import forecast_shard, plan_base_job
    from pipelines.forecasting.lm_forecasts import forecast_pairs, pair_sources
    from pipelines.generation.candidates import build_candidates, write_batch
    from warehouse.db import connect
    from warehouse.ingest import ingest_path

    kernels = build_candidates("softmax", 4, seed=0, compile=False)
    ids = sorted(kernels["kernel_id"].to_list())
    pairs = pl.DataFrame({"pair_id": [f"p{i}" for i in range(1, len(ids))], "task": "softmax",
                          "hardware_id": "a-device-the-warehouse-does-not-know",
                          "anchor_kernel_id": ids[0], "candidate_kernel_id": ids[1:]})
    with connect(tmp_path / "w.duckdb") as con:
        ingest_path(con, write_batch(kernels, tmp_path / "kernels.parquet"))
        job = plan_base_job(con, "tiny", pairs, "full")
        sources = pair_sources(con, pairs)
    assert job.model_ref == "base:tiny" and job.pair_ids() == pairs["pair_id"].to_list()
    home = tmp_path / "home"

    def sharded(n: int) -> pl.DataFrame:
        shutil.rmtree(home / "forecast-cache", ignore_errors=True)  # every forward pass made
        made = [forecast_shard("", s, home, "cpu", tmp_path / "downloads") for shard in split_jobs([job], n) for s in shard]
        assert sum(passes for _, passes in made) == pairs.height and len(made) == min(n, pairs.height)
        return merge_shards(expected_pairs([job]), [rows for rows, _ in made])

    one, two = sharded(1), sharded(2)
    whole = forecast_pairs(pairs, sources, dict(DEFAULT_HARDWARE),
                           TransformersAnswerer(str(resolve_base_model("tiny", home)), readout="logprob"),
                           "base:tiny", style="full").sort("pair_id")
    p_cols = [f"p{i}" for i in range(1, 9)]
    for other in (two, whole):
        assert other["pair_id"].to_list() == one["pair_id"].to_list()
        assert other.select(p_cols).to_numpy() == pytest.approx(one.select(p_cols).to_numpy(), abs=1e-6)


def test_an_unreadable_shard_plan_is_one_line_and_writes_no_rows(tmp_path):
    from pipelines.forecasting.llm_shards import forecast_shard_file

    rows = tmp_path / "rows-gpu0.parquet"
    for plan, content in ((tmp_path / "missing.json", None), (tmp_path / "broken.json", "[{"),
                          (tmp_path / "odd.json", '[{"no_such_field": 1}]')):
        if content is not None:
            plan.write_text(content)
        with pytest.raises(ValueError, match=f"cannot read its plan {plan.name}") as e:
            forecast_shard_file(plan, rows, "file:///nowhere", tmp_path, "cpu", tmp_path / "dl")
        assert "\n" not in str(e.value) and not rows.exists()
