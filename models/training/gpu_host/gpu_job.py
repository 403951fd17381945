"""Train and evaluate the LLM surrogate variants of a job on a GPU host.

    python3 -m models.training.gpu_host.gpu_job run --job JOB --run RUN --out OUT --deadline-s 540

`run` starts one child process per supervised variant of the job (side by side on the GPUs it
sees: a 135M model leaves an H200 mostly idle, so several runs share one), starts each GRPO
variant once the variant it builds on has finished, and, before the deadline, packs what is
done into OUT: `results.tar` (per variant its status, training history and forecasts, and the
logs) and `adapter-<variant>.tar` for every finished LoRA variant (bfloat16 weights, a few MB).
RUN keeps the checkpoints: the same command again on the same host resumes every unfinished
variant where it stopped (models.training.supervised, models.training) and skips finished ones, so a
training longer than one invocation goes on across invocations.

Each variant, when its training finishes, forecasts with its best weights (logprob readout) on
its calibration pairs and on its eval pairs (the eval set, or every reference pair of the held-out
task); the temperature is fitted from the calibration forecasts where the results are ingested
(`kernelcast train ingest`, pipelines/surrogates/remote_results.py). GRPO variants also forecast with the verbalized readout.

Only torch, transformers, peft and accelerate (trl and datasets for GRPO): the host needs
nothing else of the stack. `KERNELCAST_HOME` says where the base model is converted (once, before
the children start); with CUDA_VISIBLE_DEVICES listing several GPUs, children are spread over them.

A supervised variant also trains data-parallel over several GPUs: `run --gpus-per-variant N`
starts each supervised child under `accelerate launch` (deploy/accelerate/multi_gpu.yaml) on N
GPUs of its own, and one variant can be launched by hand the same way:

    accelerate launch --config_file deploy/accelerate/multi_gpu.yaml --num_processes N \
        -m models.training.gpu_host.gpu_job variant --job JOB --run RUN --name sft-compact-full

Every process trains; the main process alone forecasts and writes the variant's files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from models.training.gpu_host.job import (
    JobError,
    read_job,
    training_rows,
    with_role,
    write_json,
    write_jsonl_gz,
)
from models.training.gpu_host.variants import Variant

log = logging.getLogger("kernelcast.gpu_job")

KIND = "variants"  # the job kind this run reads (models/training/gpu_host/job.py)
BASE = "base"  # grpo_from value: GRPO straight on the base model
STATUS_FILE = "status.json"
FORECASTS_FILE = "forecasts.jsonl.gz"
ACCELERATE_CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "accelerate" / "multi_gpu.yaml"
STOP_MARGIN_S = 75.0  # a child stops this long before the deadline: evaluation and packing follow
EVAL_RESERVE_S = 45.0  # and does not start training if less than this is left


def variants_of(meta: dict[str, Any], names: str | None) -> list[Variant]:
    """The job's variants, or the named subset (comma-separated), in job order."""
    all_variants = [Variant.from_dict(v) for v in meta.get("variants", [])]
    if not names:
        return all_variants
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {v.name for v in all_variants}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise JobError(f"unknown variant(s) {', '.join(unknown)}; the job has {', '.join(sorted(known))}")
    return [v for v in all_variants if v.name in wanted]


def rows_for(meta: dict[str, Any], kernels: dict[str, dict[str, Any]], pairs: list[dict[str, Any]],
             role: str, style: str) -> list[dict[str, Any]]:
    """Training rows (prompt, true_bin, pair_id) of the pairs serving `role`, in `style`."""
    return training_rows(meta, kernels, with_role(pairs, role), style)


def _status(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / STATUS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _forecast_rows(rows: list[dict[str, Any]], probs: Any, role: str, readout: str = "logprob") -> list[dict[str, Any]]:
    return [{"pair_id": r["pair_id"], "role": role, "readout": readout, "repeat": 0, "parse_ok": True,
             "parse_error": None, "p": [round(float(x), 7) for x in row]} for r, row in zip(rows, probs.tolist(), strict=True)]


def _evaluate_logprob(model: Any, tokenizer: Any, rows_by_role: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    import torch

    from models.training.supervised import encode_rows, readout_probs

    out: list[dict[str, Any]] = []
    autocast = torch.cuda.is_available()
    for role, rows in rows_by_role.items():
        if not rows:
            continue
        enc, labels = encode_rows(tokenizer, rows)
        probs = readout_probs(model, tokenizer, enc, labels, tokens_per_batch=65536, autocast=autocast)
        out += _forecast_rows(rows, probs, role)
    return out


def _load_for_eval(base_path: Path, best: Path, finetune: str):
    """(model, tokenizer) of a finished supervised variant's best weights."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if finetune == "lora":
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32), str(best))
    else:
        model = AutoModelForCausalLM.from_pretrained(str(best), dtype=torch.float32)
    return model.to(device).eval(), PreTrainedTokenizerFast.from_pretrained(str(best))


def pack_adapter(best: Path, tar_path: Path) -> None:
    """A LoRA adapter's config and weights (bfloat16) as one tar, written whole."""
    import torch
    from safetensors.torch import load_file, save_file

    tmp_dir = tar_path.with_suffix(".d")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    weights = load_file(str(best / "adapter_model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(tmp_dir / "adapter_model.safetensors"))
    shutil.copy(best / "adapter_config.json", tmp_dir / "adapter_config.json")
    part = tar_path.with_name(tar_path.name + ".part")
    with tarfile.open(part, "w") as tar:
        for f in sorted(tmp_dir.iterdir()):
            tar.add(f, arcname=f"adapter/{f.name}")
    part.replace(tar_path)
    shutil.rmtree(tmp_dir, ignore_errors=True)


def _open_variant(job: Path, run: Path, variant: Variant):
    """(job.json, kernels, pairs, the variant's folder (created), its status so far)."""
    meta, kernels, pairs = read_job(job, KIND)
    folder = run / variant.name
    folder.mkdir(parents=True, exist_ok=True)
    return meta, kernels, pairs, folder, _status(folder)


def run_supervised_variant(job: Path, run: Path, variant: Variant, stop_at: float | None,
                           base_model: str) -> dict[str, Any]:
    """Train (or resume) one supervised variant, then forecast with its best weights.

    Under `accelerate launch` every process trains; the main process alone then forecasts and
    writes the status (the others return the training's status)."""
    from models.base_model import resolve_base_model
    from models.training.data_parallel import is_main_process
    from models.training.supervised import train_supervised

    meta, kernels, pairs, folder, status = _open_variant(job, run, variant)
    if status.get("evaluated"):
        return status
    train = rows_for(meta, kernels, pairs, variant.train_role, variant.style)
    calib = rows_for(meta, kernels, pairs, variant.calibration_role, variant.style)
    settings = variant.supervised_settings(base_model)
    t0 = time.time()
    spent = float(status.get("train_seconds", 0.0))
    finish_by = t0 + max(0.0, variant.train_budget_s - spent) if variant.train_budget_s else None
    result = train_supervised(settings, train, calib, folder / "sft", folder / "ckpt", stop_at=stop_at,
                              on_epoch=lambda r: log.info("%s %s", variant.name, json.dumps(r)),
                              finish_by=finish_by)
    status = {"name": variant.name, "finished": result.finished, "best_epoch": result.best_epoch,
              "epochs_run": len(result.history), "rows_used": result.rows_used,
              "train_seconds": round(status.get("train_seconds", 0.0) + time.time() - t0, 1),
              "evaluated": False, "split": variant.split}
    if not is_main_process():
        return status
    if result.finished:
        t1 = time.time()
        model, tokenizer = _load_for_eval(resolve_base_model(base_model), result.model_dir, variant.finetune)
        evals = rows_for(meta, kernels, pairs, variant.eval_role, variant.style)
        forecasts = _evaluate_logprob(model, tokenizer, {variant.calibration_role: calib, variant.eval_role: evals})
        write_jsonl_gz(folder / FORECASTS_FILE, forecasts)
        status.update(evaluated=True, eval_seconds=round(time.time() - t1, 1), forecasts=len(forecasts))
        if variant.finetune == "lora":
            pack_adapter(result.model_dir, folder / "adapter.tar")
    write_json(folder / STATUS_FILE, status)
    return status


def run_grpo_variant(job: Path, run: Path, variant: Variant, stop_at: float, base_model: str) -> dict[str, Any]:
    """GRPO on top of a finished supervised variant's weights, then both readouts."""
    from models.base_model import resolve_base_model
    from models.training.grpo import train_grpo
    from models.training.settings import TrainingSettings
    meta, kernels, pairs, folder, status = _open_variant(job, run, variant)
    if status.get("evaluated"):
        return status
    parent = run / variant.grpo_from
    if variant.grpo_from == BASE:  # the paper's setting: GRPO on the base model itself
        merged = resolve_base_model(base_model)
    elif not _status(parent).get("finished"):
        raise JobError(f"{variant.name}: {variant.grpo_from} has not finished training")
    else:
        merged = parent / "merged"
    if not (merged / "config.json").is_file():
        parent_variant = Variant.from_dict(next(v for v in meta["variants"] if v["name"] == variant.grpo_from))
        model, tokenizer = _load_for_eval(resolve_base_model(base_model), parent / "sft" / "best", parent_variant.finetune)
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model.save_pretrained(str(merged.with_name("merged.part")))
        tokenizer.save_pretrained(str(merged.with_name("merged.part")))
        merged.with_name("merged.part").replace(merged)
    train = rows_for(meta, kernels, pairs, variant.train_role, variant.style)
    settings = TrainingSettings.profile(
        "gpu", base_model=str(merged), reward=variant.reward, max_steps=variant.grpo_steps,
        sft_steps=variant.grpo_sft_steps, sft_lr=2e-4, prompt_style=variant.style, max_completion_length=160,
        micro_batch_size=4, gradient_checkpointing=False,
    )
    t0 = time.time()
    result = train_grpo(settings, train, folder / "grpo", checkpoint_dir=folder / "ckpt", stop_at=stop_at)
    status = {"name": variant.name, "finished": result.finished, "steps": result.steps, "evaluated": False,
              "train_seconds": round(status.get("train_seconds", 0.0) + time.time() - t0, 1),
              "split": variant.split, "metrics": result.metrics}
    if result.finished:
        from models.backends import ForecastRequest
        from models.backends.transformers_backend import TransformersAnswerer

        t1 = time.time()
        model, tokenizer = _load_for_eval(merged, folder / "grpo", "lora")  # the GRPO adapter on its base
        calib = rows_for(meta, kernels, pairs, variant.calibration_role, variant.style)
        evals = rows_for(meta, kernels, pairs, variant.eval_role, variant.style)
        forecasts = _evaluate_logprob(model, tokenizer, {variant.calibration_role: calib, variant.eval_role: evals})
        verbal = TransformersAnswerer(model, tokenizer, readout="verbalized", temperature=1.0, max_new_tokens=160,
                                        batch_size=64, model_ref=f"grpo:{variant.name}")
        for r, f in zip(evals, verbal.forecast([ForecastRequest(r["prompt"]) for r in evals]), strict=True):
            forecasts.append({"pair_id": r["pair_id"], "role": variant.eval_role, "readout": "verbalized",
                              "repeat": 0, "parse_ok": bool(f.parse_ok), "parse_error": f.parse_error,
                              "predicted_bin": f.predicted_bin, "raw_sum": f.raw_sum,
                              "p": list(f.p) if f.p else None})
        write_jsonl_gz(folder / FORECASTS_FILE, forecasts)
        status.update(evaluated=True, eval_seconds=round(time.time() - t1, 1), forecasts=len(forecasts))
    write_json(folder / STATUS_FILE, status)
    return status


def _child(args: argparse.Namespace) -> int:
    meta, _, _ = read_job(args.job, KIND)
    variant = variants_of(meta, args.name)[0]
    fn = run_grpo_variant if variant.grpo_from else run_supervised_variant
    status = fn(Path(args.job), Path(args.run), variant, args.stop_at, args.base_model)
    from models.training.data_parallel import is_main_process

    if is_main_process():  # one status line per variant, not one per process
        print(json.dumps(status))
    return 0


def _free_port() -> int:
    """A free TCP port for one launch's rendezvous (launches side by side must not share one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_command(job: Path, run: Path, variant: Variant, stop_at: float, base_model: str,
                  processes: int) -> list[str]:
    """The command of one variant's child: under `accelerate launch` on `processes` GPUs for a
    supervised variant when processes > 1 (GRPO variants run as one process)."""
    cmd = ["-m", "models.training.gpu_host.gpu_job", "variant", "--job", str(job), "--run", str(run),
           "--name", variant.name, "--stop-at", str(stop_at), "--base-model", base_model]
    if processes <= 1 or variant.grpo_from:
        return [sys.executable, *cmd]
    if not ACCELERATE_CONFIG.is_file():
        raise JobError(f"{ACCELERATE_CONFIG} is missing: copy deploy/accelerate/ with the code")
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
            "--num_processes", str(processes), "--main_process_port", str(_free_port()), *cmd]


def _pack(run: Path, out: Path, variants: list[Variant]) -> None:
    """results.tar (status, history, forecasts, logs of every variant) and one tar per adapter."""
    out.mkdir(parents=True, exist_ok=True)
    part = out / "results.tar.part"
    with tarfile.open(part, "w") as tar:
        for v in variants:
            folder = run / v.name
            for name in (STATUS_FILE, FORECASTS_FILE, "sft/history.json", "child.log"):
                if (folder / name).is_file():
                    tar.add(folder / name, arcname=f"{v.name}/{name}")
            for state in ("grpo/training.json",):
                if (folder / state).is_file():
                    tar.add(folder / state, arcname=f"{v.name}/{state}")
        if (run / "summary.json").is_file():
            tar.add(run / "summary.json", arcname="summary.json")
    part.replace(out / "results.tar")
    for v in variants:
        if (run / v.name / "adapter.tar").is_file():
            shutil.copy(run / v.name / "adapter.tar", out / f"adapter-{v.name}.tar")


def _run(args: argparse.Namespace) -> int:
    from models.base_model import resolve_base_model

    job, run, out = Path(args.job), Path(args.run), Path(args.out)
    meta, _, _ = read_job(job, KIND)
    variants = variants_of(meta, args.variants)
    run.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.deadline_s if args.deadline_s else float("inf")
    stop_at = deadline - STOP_MARGIN_S
    resolve_base_model(args.base_model)  # convert once, before the children race for it
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if args.gpus_per_variant < 1 or (gpus and args.gpus_per_variant > len(gpus)):
        raise JobError(f"--gpus-per-variant {args.gpus_per_variant}: give 1 to {len(gpus) or 'the GPU count'}")
    pending = [v for v in variants if not _status(run / v.name).get("evaluated")]
    procs: dict[str, tuple[subprocess.Popen, Any]] = {}
    started = 0  # GPUs handed out so far, round robin

    def start(v: Variant) -> None:
        nonlocal started
        processes = 1 if v.grpo_from else args.gpus_per_variant
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(started + j) % len(gpus)] for j in range(processes))
        started += processes
        (run / v.name).mkdir(parents=True, exist_ok=True)
        cmd = child_command(job, run, v, stop_at, args.base_model, processes)
        logf = open(run / v.name / "child.log", "a")  # noqa: SIM115 - closed when the child ends
        # A session of its own: a variant under `accelerate launch` is a launcher and its workers,
        # and the deadline must end all of them, not only the launcher.
        procs[v.name] = (subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                          start_new_session=True), logf)
        log.info("started %s on %d process(es)", v.name, processes)

    while pending or procs:
        for v in list(pending):
            ready = not v.grpo_from or v.grpo_from == BASE or _status(run / v.grpo_from).get("evaluated")
            blocked = v.grpo_from and v.grpo_from != BASE and v.grpo_from not in {x.name for x in variants}
            if blocked:
                pending.remove(v)
                log.info("skipping %s: %s is not part of this run", v.name, v.grpo_from)
            elif ready and time.time() < stop_at - EVAL_RESERVE_S:
                pending.remove(v)
                start(v)
            elif time.time() >= stop_at - EVAL_RESERVE_S:
                pending.remove(v)
                log.info("not starting %s: too little time left", v.name)
        for name, (proc, logf) in list(procs.items()):
            if proc.poll() is not None:
                logf.close()
                del procs[name]
                log.info("%s ended (exit %s): %s", name, proc.returncode, json.dumps(_status(run / name)))
            elif time.time() > deadline - 20:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(2)
    summary = {v.name: _status(run / v.name) for v in variants}
    write_json(run / "summary.json", summary)
    _pack(run, out, variants)
    for name, s in summary.items():
        print(f"{name:28s} finished={s.get('finished')} epochs={s.get('epochs_run', s.get('steps'))} "
              f"best={s.get('best_epoch')} train_s={s.get('train_seconds')} evaluated={s.get('evaluated')}")
    return 0


def fill_features(job: Path, features: Path, out_job: Path) -> int:
    """Copy a job to `out_job` with compile features filled in from a features Parquet (rows
    of status 'compiled'); the kernels count that gained features."""
    import pyarrow.parquet as pq

    from models.training.gpu_host.job import write_job

    meta, kernels, pairs = read_job(job)
    rows = {r["kernel_id"]: r for r in pq.read_table(features).to_pylist() if r["status"] == "compiled"}
    keys = ("n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches")
    gained = 0
    for k in kernels.values():
        if not k.get("features") and k["kernel_id"] in rows:
            k["features"] = {f: rows[k["kernel_id"]][f] for f in keys}
            gained += 1
    write_job(out_job, meta["kind"], meta, kernels.values(), pairs)
    return gained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m models.training.gpu_host.gpu_job", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and evaluate the job's variants (resumes)")
    r.add_argument("--job", required=True)
    r.add_argument("--run", required=True, help="working folder kept between invocations (checkpoints)")
    r.add_argument("--out", required=True, help="where results.tar and the adapters go")
    r.add_argument("--variants", default=None, help="comma-separated subset (default: all)")
    r.add_argument("--deadline-s", type=float, default=0.0, help="seconds until everything must be packed (0: none)")
    r.add_argument("--base-model", default="smollm2")
    r.add_argument("--gpus-per-variant", type=int, default=1,
                   help="train each supervised variant data-parallel on this many GPUs (accelerate launch)")
    f = sub.add_parser("fill-features", help="copy a job with compile features filled in")
    f.add_argument("--job", required=True)
    f.add_argument("--features", required=True, help="Parquet of pipelines.generation.compile_batch")
    f.add_argument("--out-job", required=True)
    c = sub.add_parser("variant", help="one variant (started by run)")
    c.add_argument("--job", required=True)
    c.add_argument("--run", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--stop-at", type=float, default=None,
                   help="time.time() at which to checkpoint and stop (default: train to the end)")
    c.add_argument("--base-model", default="smollm2")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.command == "fill-features":
            print(f"{fill_features(Path(args.job), Path(args.features), Path(args.out_job))} kernels gained features")
            return 0
        return _run(args) if args.command == "run" else _child(args)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
