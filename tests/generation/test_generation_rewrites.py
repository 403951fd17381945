"""The rewrite engine on real template kernels, and the batch builder of non-template kernels."""

from __future__ import annotations

import ast
import json

import polars as pl
import pytest

from pipelines.generation import external_batch, handwritten, rewrites, sampler
from warehouse.formats import KERNEL_BATCH_SCHEMA
from warehouse.ids import kernel_id

TASKS = ("softmax", "rms_norm", "matmul_bias_gelu", "gdn_chunk_fwd_o")


@pytest.fixture(scope="module")
def parents() -> list[dict]:
    """Fresh template kernels of four tasks of different shapes of code (row-wise, GEMM, chunked)."""
    return [r for task in TASKS for r in sampler.generate_lineage(task, 12, seed=1)]


def _applies(rule: str, parents: list[dict]) -> list[tuple[dict, str, list[str]]]:
    out = []
    for i, p in enumerate(parents):
        got = rewrites.rewrite_source(p["source"], p["task"], [rule], seed=i)
        if got is not None:
            out.append((p, *got))
    return out


@pytest.mark.parametrize("rule", list(rewrites.RULES))
def test_every_rule_rewrites_template_kernels(rule, parents):
    done = _applies(rule, parents)
    assert done, f"{rule} applied to none of {len(parents)} template kernels"
    for parent, child, applied in done:
        tree = ast.parse(child)  # parses
        assert child != parent["source"]
        assert [a.split(":", 1)[0] for a in applied] == [rule]
        assert any(isinstance(n, ast.FunctionDef) and n.name == "custom_kernel" for n in tree.body)
        # the parent's knob listing is gone with its docstring; the code differs beyond that too
        assert "Knobs" not in ast.get_docstring(tree)
        body = ast.unparse(ast.Module(body=ast.parse(parent["source"]).body[1:], type_ignores=[]))
        assert ast.unparse(ast.Module(body=tree.body[1:], type_ignores=[])) != body
    # deterministic with a seed
    p = done[0][0]
    i = parents.index(p)
    assert rewrites.rewrite_source(p["source"], p["task"], [rule], seed=i) == (done[0][1], done[0][2])


def test_specific_rules_change_what_they_say(parents):
    softmax = [p for p in parents if p["task"] == "softmax"]
    child, applied = rewrites.rewrite_source(softmax[0]["source"], "softmax", ["debug_barrier"], seed=0)
    assert "tl.debug_barrier()" in child and "debug_barrier" not in softmax[0]["source"]
    child, _ = rewrites.rewrite_source(softmax[0]["source"], "softmax", ["split_launch"], seed=0)
    assert "PID0_OFFSET" in child and child.count("](") >= 2
    child, applied = rewrites.rewrite_source(softmax[0]["source"], "softmax", ["launch_warps"], seed=0)
    old, new = applied[0].rsplit("=", 1)[1].split("->")
    assert f"num_warps={new}" in child
    got = [rewrites.rewrite_source(p["source"], p["task"], ["inline_constant"], seed=3) for p in softmax]
    child, applied = next(g for g in got if g)
    name = applied[0].split(":", 1)[1].split("=")[0]
    assert not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(ast.parse(child)))


def test_bad_sources_are_refused_in_one_line():
    with pytest.raises(rewrites.RewriteError, match="does not parse"):
        rewrites.rewrite_source("def (:\n", "softmax", ["debug_barrier"], seed=0)
    with pytest.raises(rewrites.RewriteError, match="no custom_kernel"):
        rewrites.rewrite_source("x = 1\n", "softmax", ["debug_barrier"], seed=0)
    with pytest.raises(rewrites.RewriteError, match="unknown rewrite rule"):
        rewrites.rewrite_source("def custom_kernel(d):\n    return d\n", "softmax", ["nope"], seed=0)
    # nothing to rewrite in a PyTorch module: None, not an exception
    assert rewrites.rewrite_source("def custom_kernel(d):\n    return d\n", "softmax", ["split_launch"], 0) is None


def test_children_records_have_lineage_and_no_metadata(parents):
    kids = rewrites.rewrite_children(parents, seed=5)
    assert len(kids) >= 0.9 * len(parents)
    ids = [k["kernel_id"] for k in kids]
    assert len(set(ids)) == len(ids) and not set(ids) & {p["kernel_id"] for p in parents}
    by_id = {p["kernel_id"]: p for p in parents}
    for k in kids:
        assert list(k) == KERNEL_BATCH_SCHEMA.names
        assert k["kernel_id"] == kernel_id(k["source"])
        assert k["algorithm"] is None and k["knobs_json"] is None
        assert k["parent_kernel_id"] in by_id and by_id[k["parent_kernel_id"]]["task"] == k["task"]
        rules = [m.split(":", 1)[0] for m in k["mutation"].split("; ")]
        assert all(r in rewrites.RULES for r in rules)
        assert k["generator"] == (f"rewrite:{rules[0]}" if len(rules) == 1 else "rewrite")
    assert kids == rewrites.rewrite_children(parents, seed=5)


@pytest.mark.slow
def test_rewrites_compile_for_sm90_and_some_pass_the_interpreter(parents):
    from pipelines.generation.aot import compile_many
    from pipelines.profiling.check import check_sources

    softmax = [p for p in parents if p["task"] == "softmax"]
    rules = ("inline_constant", "split_launch", "rows_per_program", "debug_barrier", "mask_select", "loop_unroll")
    kids = []
    for rule in rules:
        src, _ = next(g for g in (rewrites.rewrite_source(p["source"], "softmax", [rule], seed=2) for p in softmax) if g)
        kids.append({"task": "softmax", "source": src, "language": "triton"})
    feats = compile_many(kids, n_workers=2, case="correctness")
    assert [f.status for f in feats] == ["compiled"] * len(rules), [f.error for f in feats]
    outcomes = dict(zip(rules, check_sources([("softmax", k["source"]) for k in kids], n_workers=2, timeout_s=300),
                        strict=True))
    # Triton 3.6's interpreter has no bf16 scalar constants, which tl.where(mask, bf16, -inf) needs;
    # the same child compiles for sm_90 above
    assert "get_bf16" in outcomes.pop("mask_select").message
    assert all(o.ok for o in outcomes.values()), {r: o.message for r, o in outcomes.items()}


def test_children_per_task_adds_up_and_favours_cheap_tasks():
    counts = external_batch.children_per_task(3700)
    assert sum(counts.values()) == 3700 and set(counts) == set(external_batch.TASK_SHARES)
    frame = pl.DataFrame({"task": ["a"] * 5 + ["b"] * 2, "kernel_id": list("1234567")})
    mixed = external_batch.interleave(frame, chunk=2)
    assert mixed["kernel_id"].to_list() == list("1267345")
    assert external_batch.interleave(mixed, chunk=2)["kernel_id"].to_list() == list("1267345")
    assert counts["softmax"] > counts["matmul_bias_gelu"] > counts["trimul"] > 0


def test_batch_builder_writes_rewrites_and_handwritten_kernels(tmp_path):
    out = tmp_path / "nontemplate.parquet"
    summary = external_batch.build_external_batch(
        out, 36, seed=2, compile=False, check_handwritten=False, say=lambda _m: None)
    frame = pl.read_parquet(out)
    assert frame.columns[: len(KERNEL_BATCH_SCHEMA)] == KERNEL_BATCH_SCHEMA.names
    assert frame["kernel_id"].n_unique() == frame.height == summary["rows"]
    hand = frame.filter(pl.col("generator").str.starts_with("handwritten:"))
    assert hand.height == len(handwritten.kernel_files())
    kids = frame.filter(pl.col("generator").str.starts_with("rewrite"))
    assert kids.height == 36 and set(kids["task"]) == set(external_batch.TASK_SHARES)
    assert kids["parent_kernel_id"].null_count() == 0
    assert frame["algorithm"].null_count() == frame["knobs_json"].null_count() == frame.height
    parents = external_batch.measured_parents()
    assert set(kids["parent_kernel_id"]) <= set(parents["kernel_id"])
    assert json.loads((tmp_path / "nontemplate.parquet.summary.json").read_text())["rows"] == frame.height
    # same seed, same batch
    again = external_batch.build_external_batch(
        tmp_path / "again.parquet", 36, seed=2, compile=False, check_handwritten=False, say=lambda _m: None)
    assert again["rows"] == summary["rows"]
    assert pl.read_parquet(tmp_path / "again.parquet")["kernel_id"].to_list() == frame["kernel_id"].to_list()
    # --refresh: compile features that arrive later are merged by kernel id, nothing regenerated
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.generation.compile_batch import SCHEMA

    first = kids.row(0, named=True)["kernel_id"]
    row = {"kernel_id": first, "target": "sm_90", "status": "compiled", "n_regs": 40, "n_spills": 0,
           "shared_bytes": 0, "n_kernels": 1, "n_launches": 1, "error": None, "seconds": 1.5}
    pq.write_table(pa.Table.from_pylist([row], schema=SCHEMA), tmp_path / "nontemplate.parquet.features.parquet")
    refreshed = external_batch.refresh_batch(out, say=lambda _m: None)
    back = pl.read_parquet(out)
    assert back["kernel_id"].to_list() == frame["kernel_id"].to_list()
    assert back.filter(pl.col("kernel_id") == first)["n_regs"].to_list() == [40]
    assert refreshed["compile_status"] == {"compiled": 1, "None": frame.height - 1}


def test_batch_command_refuses_bad_arguments(capsys):
    assert external_batch.main(["--out", "x.parquet", "--rules", "nope"]) == 2
    assert "unknown rule" in capsys.readouterr().err
    assert external_batch.main(["--out", "x.parquet", "--llm-endpoint", "http://127.0.0.1:9/v1"]) == 2
    assert external_batch.main(["--out", "x.parquet", "--measurements", "/nonexistent"]) == 2
    assert "no kernels" in capsys.readouterr().err


@pytest.mark.parametrize("rule,arg", [("split_launch", "PID0_OFFSET"), ("rows_per_program", "GRID0")])
def test_a_restructured_kernel_gets_its_new_argument_at_every_launch(rule, arg):
    """trimul launches its gate and layernorm kernels at two sites each: a rule that rewrote one
    launch left the other without the argument, a runtime error on the GPU."""
    parents = sampler.generate_lineage("trimul", 24, seed=3)
    done = _applies(rule, parents)
    assert done, f"{rule} applied to none of {len(parents)} trimul kernels"
    for _parent, child, applied in done:
        kname = applied[0].split(":")[1]
        tree = ast.parse(child)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == kname]
        assert calls and all(any(k.arg == arg for k in c.keywords) for c in calls), (kname, ast.unparse(tree))
