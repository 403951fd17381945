"""Train surrogate reward variants on a GPU host and forecast the eval set with each.

Runs where torch, transformers, peft, trl and datasets are installed but not duckdb,
polars or mlflow (the H200 host with the .gpu-carry wheels). The inputs are JSONL files that
`scripts/surrogate_job.py export` writes from the warehouse; what this writes comes back to
`scripts/surrogate_job.py ingest`, which logs the runs to MLflow, registers the adapters and
evaluates the forecasts beside the reference forecasters.

    python3 scripts/gpu_train_surrogates.py --job JOB_DIR --out OUT_DIR \
        [--variants correctness,correctness+brier,correctness+crps] [--profile gpu] \
        [--set max_completion_length=1024 --set sft_steps=60 ...] [--repeats 4]

JOB_DIR holds train.jsonl ({"prompt", "true_bin", "pair_id"}) and eval.jsonl ({"prompt",
"pair_id", ...}), or the same gzipped (train.jsonl.gz, eval.jsonl.gz: a job of full prompts
from a large dataset is 25 MB plain, 4 MB gzipped, and a GPU call carries 64 MiB at most). OUT_DIR gets, per variant, <variant>.tar (variant name with "+" as "_")
holding <variant>/adapter/ (LoRA weights, no tokenizer: the base model's is the same) and
<variant>/training.json (settings, metrics, per-step history, warm-up losses, seconds),
written as soon as the variant is trained; forecasts-<variant or base>-<readout>.jsonl (one row per
model, readout, pair and repeat), each written whole when its readout finishes; and summary.json (per
variant: the readouts finished), rewritten after each step, so a run stopped by a time limit
still returns whatever finished. One tar and one forecast file per model keep the number of files small
(a GPU call returns at most 8).

--parallel trains the variants at once, one child process each (this script with one variant
and --skip-base, its own sub-folder and CUDA_VISIBLE_DEVICES from --gpus, round robin), while
this process forecasts with the base model; then it merges the children's files into OUT_DIR.
A 135M model leaves an H200 mostly idle (rollouts are token-by-token generation), so three
variants side by side take little longer than one. --deadline-s kills children still running
then, so a GPU call with a hard limit still returns the variants that finished.

A run longer than one GPU call goes on in the next: GRPO checkpoints every step in the
children's folders (OUT_DIR/_<variant>/<variant>-ckpt) and, with --deadline-s, stops cleanly
--stop-margin-s before the deadline; the variant is then listed under "unfinished" in
summary.json. The same command on the same OUT_DIR (a warm host keeps /root between calls)
resumes each variant from its last whole step without repeating the warm-up, evaluates the
readouts still missing, and skips whatever is done (base forecasts included).

The eval forecasts use two readouts: "logprob" (one forward pass, deterministic) and
"verbalized" (sampled at the training temperature, --repeats answers per pair), the
model_ref of a row saying which model and readout.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("gpu_train_surrogates")
READOUTS = ("logprob", "verbalized")  # of each trained variant, in this order


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL job file, or of its gzipped twin (<name>.gz, `surrogate_job.py export
    --gzip`); a missing file or a bad line ends the run with one line."""
    gz = path.with_name(path.name + ".gz")
    if not path.exists() and gz.exists():
        path = gz
    try:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            lines = f.read().splitlines()
    except (OSError, EOFError) as e:  # EOFError: a truncated .gz
        raise SystemExit(f"error: cannot read {path}: {getattr(e, 'strerror', None) or e}") from e
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {path}:{number}: not JSON ({e.msg})") from e
    return rows


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values parsed as JSON when they parse (numbers, lists), else strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants key=value, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def safe_name(variant: str) -> str:
    """A file name for a variant: "correctness+brier" -> "correctness_brier"."""
    return variant.replace("+", "_")


def forecast_rows(model: Any, tokenizer: Any, rows: list[dict[str, Any]], model_ref: str,
                  repeats: int, max_new_tokens: int, temperature: float,
                  batch_size: int = 32, readouts: tuple[str, ...] = ("logprob", "verbalized")) -> list[dict[str, Any]]:
    """Logprob and verbalized forecasts of `rows` by one model, as forecast-table rows."""
    from models.backends import ForecastRequest
    from models.backends.transformers_backend import TransformersForecaster

    requests = [ForecastRequest(r["prompt"], request_id=r["pair_id"]) for r in rows]
    out: list[dict[str, Any]] = []
    plans = [("logprob", 1, {}), ("verbalized", repeats,
                                     {"max_new_tokens": max_new_tokens, "temperature": temperature})]
    for readout, n, kwargs in [r for r in plans if r[0] in readouts]:
        t0 = time.perf_counter()
        forecaster = TransformersForecaster(model, tokenizer, readout=readout, batch_size=batch_size,
                                            model_ref=model_ref, seed=0, **kwargs)
        results = forecaster.forecast(requests, repeats=n)
        for i, f in enumerate(results):
            out.append({"pair_id": rows[i // n]["pair_id"], "model_ref": f"{model_ref}|{readout}",
                        "repeat": i % n, **f.to_row()})
        parsed = sum(1 for f in results if f.parse_ok)
        log.info("%s %s: %d forecasts, %d parsed, %.1f s", model_ref, readout, len(results), parsed,
                 time.perf_counter() - t0)
    return out


def write_whole(path: Path, write: Any) -> None:
    """Write `path` through `write(tmp_path)` and rename it into place: a run killed by a
    deadline leaves the previous file or none, never half of one."""
    tmp = path.with_name(path.name + ".part")
    write(tmp)
    os.replace(tmp, path)


def _free(torch: Any) -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def child_command(args: argparse.Namespace, variant: str, out: Path) -> list[str]:
    """This script's command line for one variant of a --parallel run."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--job", str(args.job), "--out", str(out),
           "--variants", variant, "--skip-base", "--profile", args.profile, "--repeats", str(args.repeats),
           "--eval-limit", str(args.eval_limit), "--eval-max-new-tokens", str(args.eval_max_new_tokens),
           "--batch-size", str(args.batch_size)]
    for item in args.set:
        cmd += ["--set", item]
    if args.stop_at is not None:
        cmd += ["--stop-at", repr(args.stop_at)]
    return cmd


def _read_summary(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def merge_child(summary: dict[str, Any], child_out: Path, out: Path, variant: str) -> None:
    """Copy a child's tar and forecast files into `out` and its variant record into `summary`.
    A variant the clock stopped inside GRPO goes under "unfinished" (its checkpoint stays in the
    child's folder, which a later call with the same --out resumes); one that trained nothing
    goes under "skipped"."""
    name = safe_name(variant)
    child = _read_summary(child_out)
    done = variant in child.get("variants", {}) and (child_out / f"{name}.tar").is_file()
    if not done:
        if variant in child.get("unfinished", {}):
            summary.setdefault("unfinished", {})[variant] = child["unfinished"][variant]
        else:
            summary.setdefault("skipped", []).append(variant)
        return
    # Forecast files exist for the readouts that finished before any deadline.
    for path in [child_out / f"{name}.tar", *sorted(child_out.glob(f"forecasts-{name}-*.jsonl"))]:
        shutil.copy2(path, out / path.name)
    summary["variants"][variant] = child["variants"][variant]


def seed_child(out: Path, child_out: Path, variant: str) -> bool:
    """Hand a variant trained in an earlier call to its child when the child's folder lacks it,
    as on a fresh host given a results folder that came back (the children's folders stay on
    the host that trained): its tar, forecasts and record, so the child evaluates the readouts
    still missing instead of training again. True when it seeded."""
    name = safe_name(variant)
    parent = _read_summary(out)
    record = parent.get("variants", {}).get(variant)
    if record is None or not (out / f"{name}.tar").is_file() or (child_out / f"{name}.tar").is_file():
        return False
    for path in [out / f"{name}.tar", *sorted(out.glob(f"forecasts-{name}-*.jsonl"))]:
        shutil.copy2(path, child_out / path.name)
    keys = ("base_model", "profile", "overrides", "train_rows", "eval_rows", "repeats", "device")
    child = {**{k: parent[k] for k in keys if k in parent}, "variants": {variant: record}}
    write_whole(child_out / "summary.json", lambda p: p.write_text(json.dumps(child, indent=1, default=str)))
    return True


def run_children(args: argparse.Namespace, variants: list[str]) -> list[tuple[str, Path, Any]]:
    """Start one child per variant; [(variant, its out folder, Popen)]."""
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus else []
    children = []
    for i, variant in enumerate(variants):
        child_out = args.out / f"_{safe_name(variant)}"
        child_out.mkdir(parents=True, exist_ok=True)
        if seed_child(args.out, child_out, variant):
            log.info("%s: trained in an earlier call; its child evaluates what is missing", variant)
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        log_file = open(args.out / f"train-{safe_name(variant)}.log", "w")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(child_command(args, variant, child_out), env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
        children.append((variant, child_out, proc))
        log.info("%s: child %d on GPU %s", variant, proc.pid, env.get("CUDA_VISIBLE_DEVICES", "(all)"))
    return children


def wait_children(children: list[tuple[str, Path, Any]], deadline: float | None) -> None:
    """Wait for every child; kill those still running at `deadline` (perf_counter time)."""
    import signal

    for variant, _, proc in children:
        timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.warning("%s: killed at the deadline", variant)
            continue
        if code:
            log.warning("%s: child exited with %d (see its log)", variant, code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", type=Path, required=True, help="folder with train.jsonl and eval.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default="correctness,correctness+brier,correctness+crps")
    ap.add_argument("--profile", default="gpu", help="TrainingSettings profile (gpu = the paper's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one TrainingSettings field (repeatable)")
    ap.add_argument("--repeats", type=int, default=4, help="sampled verbalized answers per eval pair")
    ap.add_argument("--eval-limit", type=int, default=0, help="forecast only the first N eval rows (0 = all)")
    ap.add_argument("--eval-max-new-tokens", type=int, default=256,
                    help="token budget of a verbalized eval answer (the warm-up format is ~70 tokens)")
    ap.add_argument("--batch-size", type=int, default=32, help="eval forecasts per forward/generate batch")
    ap.add_argument("--skip-base", action="store_true", help="do not forecast with the base model")
    ap.add_argument("--base-readouts", default="logprob,verbalized",
                    help="readouts for the base model (zero-shot SmolLM2 never parses a verbalized answer, and "
                         "its 674 full-budget answers took 213 s on the H200)")
    ap.add_argument("--time-budget-s", type=float, default=0.0,
                    help="start no variant that would not finish by then, judged by the last one (0 = no limit)")
    ap.add_argument("--parallel", action="store_true", help="train the variants at once, one child process each")
    ap.add_argument("--gpus", default="", help="with --parallel: GPU indices handed out to the children in turn")
    ap.add_argument("--deadline-s", type=float, default=0.0,
                    help="with --parallel: kill children still running this long after the start (0 = never); "
                         "GRPO stops cleanly --stop-margin-s before, at a checkpointed step")
    ap.add_argument("--stop-margin-s", type=float, default=90.0,
                    help="with --deadline-s: how long before it GRPO stops starting steps (a step of 8 x 8 "
                         "full-prompt rollouts took 8-39 s on the H200)")
    ap.add_argument("--stop-at", type=float, default=None, help=argparse.SUPPRESS)  # a child's clean stop (time.time())
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import torch

    from models.base_model import resolve_base_model
    from models.registry import load_surrogate
    from models.training import TrainingSettings, train_grpo

    train = read_jsonl(args.job / "train.jsonl")
    evals = read_jsonl(args.job / "eval.jsonl")
    if args.eval_limit:
        evals = evals[: args.eval_limit]
    overrides = parse_overrides(args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [v for v in args.variants.split(",") if v]
    settings = {v: TrainingSettings.profile(args.profile, reward=v, **overrides) for v in variants}
    first = next(iter(settings.values()))
    base_path = resolve_base_model(first.base_model)
    log.info("base model %s; %d train rows, %d eval rows; cuda=%s", base_path, len(train), len(evals),
             torch.cuda.is_available())

    summary: dict[str, Any] = {"base_model": first.base_model, "profile": args.profile, "overrides": overrides,
                               "train_rows": len(train), "eval_rows": len(evals), "repeats": args.repeats,
                               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                               "variants": {}}
    earlier = _read_summary(args.out)
    if earlier:  # this folder is a run of an earlier call: go on where it stopped
        same = ("profile", "overrides", "train_rows", "eval_rows")  # settings and job
        if any(earlier.get(k) != summary[k] for k in same):
            raise SystemExit(f"error: {args.out} holds a run of another job or other settings "
                             f"({', '.join(f'{k}={earlier.get(k)}' for k in same)}); use a new --out")
        summary = {**earlier, "device": summary["device"]}

    def write_summary() -> None:
        write_whole(args.out / "summary.json", lambda p: p.write_text(json.dumps(summary, indent=1, default=str)))

    def write_forecasts(name: str, readout: str, rows: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in rows)
        write_whole(args.out / f"forecasts-{name}-{readout}.jsonl", lambda p: p.write_text(text))

    def evaluate(model: Any, tok: Any, ref: str, readout: str) -> list[dict[str, Any]]:
        return forecast_rows(model, tok, evals, ref, args.repeats, args.eval_max_new_tokens,
                             first.temperature, args.batch_size, (readout,))

    run_started = time.perf_counter()
    if args.parallel and args.deadline_s:  # children stop GRPO cleanly before they would be killed
        args.stop_at = time.time() + args.deadline_s - args.stop_margin_s
    # A variant trained and evaluated in an earlier call needs no child (nor its tar here: a
    # results folder carried to a fresh host may leave it out to stay under the carry limit).
    finished = {v: info for v, info in summary.get("variants", {}).items()
                if v in variants and set(READOUTS) <= set(info.get("readouts", []))}
    children = run_children(args, [v for v in variants if v not in finished]) if args.parallel else []
    if not args.skip_base:
        from models.backends.transformers_backend import load_model_and_tokenizer

        pending = [r for r in args.base_readouts.split(",") if not (args.out / f"forecasts-base-{r}.jsonl").is_file()]
        if pending:
            t0 = time.perf_counter()
            model, tok = load_model_and_tokenizer(base_path, dtype="bfloat16" if torch.cuda.is_available() else None)
            for readout in pending:
                write_forecasts("base", readout, evaluate(model, tok, f"base:{first.base_model}", readout))
                summary["base_eval_s"] = round(time.perf_counter() - t0, 1)
                write_summary()
            del model
    if args.parallel:
        wait_children(children, run_started + args.deadline_s if args.deadline_s else None)
        for key in ("variants", "skipped", "unfinished"):  # this call's view of every variant
            summary.pop(key, None)
        summary["variants"] = dict(finished)
        for variant, child_out, _ in children:
            merge_child(summary, child_out, args.out, variant)
        write_summary()
        print(json.dumps(summary, indent=1, default=str))
        return 0
    started, last_s = time.perf_counter(), 0.0
    for variant, s in settings.items():
        elapsed = time.perf_counter() - started
        if args.time_budget_s and last_s and elapsed + last_s > args.time_budget_s:
            log.warning("%s skipped: %.0f s used, the last variant took %.0f s, budget %.0f s",
                        variant, elapsed, last_s, args.time_budget_s)
            summary.setdefault("skipped", []).append(variant)
            write_summary()
            continue
        name = safe_name(variant)
        vdir = args.out / name
        tar_path = args.out / f"{name}.tar"
        info = summary["variants"].get(variant)
        if info is not None and tar_path.is_file():  # trained in an earlier call
            if set(READOUTS) <= set(info["readouts"]):
                continue
            with tarfile.open(tar_path) as tar:
                tar.extractall(args.out, filter="data")
            train_s = info["train_s"]
        else:
            earlier = summary.get("unfinished", {}).get(variant, {})
            t0 = time.perf_counter()
            # Checkpointed every step beside the outputs, so a run cut by the clock (stop_at, or
            # a kill) goes on from its last whole step when this script runs again on this folder.
            result = train_grpo(s, train, vdir / "adapter", checkpoint_dir=args.out / f"{name}-ckpt",
                                stop_at=args.stop_at)
            train_s = earlier.get("train_s", 0.0) + time.perf_counter() - t0
            if not result.finished:
                summary.setdefault("unfinished", {})[variant] = {"steps": result.steps, "train_s": round(train_s, 1)}
                write_summary()
                log.info("%s: stopped by the clock at GRPO step %d of %d; run again to go on", variant,
                         result.steps, s.max_steps)
                _free(torch)
                continue
            for junk in os.listdir(vdir / "adapter"):  # the base model's tokenizer is the same
                path = vdir / "adapter" / junk
                if junk == "trainer" or junk.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            # The adapter and its record are packed before the evaluation, and the forecasts are
            # written readout by readout, so a run stopped by a deadline keeps what it finished
            # (on the H200, two trained variants were lost when the deadline fell in their eval).
            record = {"settings": s.as_params(), "metrics": result.metrics, "steps": result.steps,
                      "log_history": result.log_history, "sft_losses": result.sft_losses, "train_s": train_s}
            (vdir / "training.json").write_text(json.dumps(record, indent=1, default=str))

            def pack(path: Path, vdir: Path = vdir, name: str = name) -> None:
                with tarfile.open(path, "w") as tar:
                    tar.add(vdir, arcname=name)

            write_whole(tar_path, pack)
            info = summary["variants"][variant] = {"metrics": result.metrics, "steps": result.steps,
                                                   "train_s": round(train_s, 1), "readouts": []}
            summary.get("unfinished", {}).pop(variant, None)
            write_summary()
            shutil.rmtree(args.out / f"{name}-ckpt", ignore_errors=True)
            log.info("%s: trained in %.0f s: %s", variant, train_s, result.metrics)
            _free(torch)
        t1 = time.perf_counter()
        model, tok = load_surrogate(vdir / "adapter", base_path)
        for readout in [r for r in READOUTS if r not in info["readouts"]]:
            write_forecasts(name, readout, evaluate(model, tok, f"trained:{variant}", readout))
            info["readouts"].append(readout)
            info["eval_s"] = round(info.get("eval_s", 0.0) + time.perf_counter() - t1, 1)
            t1 = time.perf_counter()
            write_summary()
        shutil.rmtree(vdir)
        last_s = train_s + info["eval_s"]
        log.info("%s: evaluated in %.0f s", variant, info["eval_s"])
        del model
        _free(torch)
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
