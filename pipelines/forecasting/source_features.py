"""Features of any kernel derived from its source alone: its sm_90 compile and a trace of one call.

A forecaster's input is what a user has (task, hardware, anchor and candidate source); this
module derives the rest for ANY kernel module that defines `custom_kernel(data)`, a template of
the generator or not:

- compile (Triton modules): the module runs on the CPU input of the task's first benchmark case
  with Triton launches compiled for the target instead of run (pipelines.generation.aot); per
  compiled kernel: registers, spills, shared memory, num_warps, num_stages and the PTX
  instruction mix (aot.PTX_CLASSES). Resources aggregate by maximum over kernels, instruction
  counts by a sum weighted by how often one call launches each kernel (an autotuned function's
  configs share its launches, so its mix is the mean over configs);
- trace (every module): `custom_kernel` runs once per benchmark case on *fake* tensors
  (torch's FakeTensorMode: shapes and dtypes, no storage, so a 16 GiB input costs nothing),
  Triton launches bound and recorded but neither compiled nor run, under a dispatch mode that
  counts the torch ops of the call and the bytes they read and write, and torch's
  FlopCounterMode. Per case: launches, programs (grid product), argument bytes per program, the
  last-wave efficiency on the target's SMs; then the mean (and min/max of programs) over cases.
  A PyTorch kernel (a reference, a GPU MODE PyTorch submission) is all torch ops; a Triton
  kernel's launcher adds its own (allocations, casts, reshapes).

Source counts (regexes over the code) are computed where the features are read
(models.classical.features), since they need no sandbox.

Untrusted code runs in child processes (`python -m pipelines.forecasting.source_features
--child`) of aot's `CompilePool`, the one pool of the sm_90 compile too: its protocol, one-line
errors, time limits and restarts; only the job handler (`_features_job`) is this module's.
Nothing here raises on a bad kernel. Runs with the standard library, numpy, torch, triton and
pyarrow only (a GPU host):

    python3 -m pipelines.forecasting.source_features --kernels K1.parquet [K2 ...] \
        --out F.parquet --workers N

Statuses of a row: `ok` (compile, where it applies, and trace both worked), `partial` (one of
them failed; the other's features are kept), `failed` (neither: import error, no custom_kernel),
`error` (our side: the task input could not be built, a worker would not start).

A caller that reads kernels again and again (a search forecasting its mutations, a service)
keeps two things warm: a `feature_pool` (the child processes stay up between calls, so torch,
triton and each task's inputs are loaded once per child, not once per call) and a
`FeatureCache` (rows by digest of the source and of everything else that decides them: task,
language, target, hardware, the feature code and the torch and triton releases; in memory and,
given a folder, on disk), so a source read once is never read again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pipelines.generation.aot import (
    DEFAULT_TIMEOUT_S,
    PTX_CLASSES,
    SM_COUNT,
    CompilePool,
    _one_line,
)

Progress = Callable[[int, int], None]  # (done, total)
STATUSES = ("ok", "partial", "failed", "error")
_MODULE = "pipelines.forecasting.source_features"
CHILD = (_MODULE, "--child")  # the reader child's entry: aot's compile loop with `_features_job`

# Resources of the compile: maxima over the module's compiled kernels.
COMPILE_COLUMNS = ("n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches", "num_warps",
                   "num_stages", "occupancy")
# PTX instruction counts, launch-weighted sums over kernels (aot.PTX_CLASSES and totals).
PTX_COLUMNS = tuple(f"ptx_{k}" for k in (*PTX_CLASSES, "instructions", "ld_global_bytes", "st_global_bytes"))
# The trace of one call per benchmark case, aggregated over the cases.
TRACE_COLUMNS = ("trace_cases", "trace_launches", "trace_programs_log2", "trace_programs_log2_min",
                 "trace_programs_log2_max", "trace_arg_bytes_log2", "trace_bytes_per_program_log2",
                 "trace_wave_efficiency", "trace_warps", "input_bytes_log2", "call_bytes_log2",
                 "torch_ops", "torch_allocs", "torch_views", "torch_distinct_ops", "torch_flops_log2",
                 "torch_bytes_log2", "torch_intensity_log2")
FEATURE_COLUMNS = (*COMPILE_COLUMNS, *PTX_COLUMNS, *TRACE_COLUMNS)
ROW_COLUMNS = ("kernel_id", "task", "target", "status", "compile_status", "error", "seconds", *FEATURE_COLUMNS)

REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
SHARED_PER_SM = 233472  # bytes, sm_90 (228 KiB)


# =============================================================================================
# Parent side
# =============================================================================================


def _row(rec: Mapping[str, Any], target: str, msg: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    row.update({k: msg.get(k) for k in ROW_COLUMNS if k in msg})
    row.update(kernel_id=rec.get("kernel_id"), task=rec.get("task"), target=target,
               status=msg.get("status") if msg.get("status") in STATUSES else "error",
               seconds=round(float(msg.get("seconds") or 0.0), 3))
    return row


def source_features_many(
    records: Iterable[Mapping[str, Any]],
    n_workers: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    target: str = "sm_90",
    compile: bool = True,
    hardware: str | None = None,
    cache: FeatureCache | None = None,
    pool: CompilePool | None = None,
) -> list[dict[str, Any]]:
    """Source features of many kernel records, in input order; never raises on a bad kernel.

    Args:
        records: mappings with 'source', 'task' (a registry task or one of
            KERNELCAST_TASK_MODULES), optional 'kernel_id' and 'language' ('triton' compiles;
            anything else, e.g. 'pytorch', is traced only).
        n_workers: child processes in parallel (with a pool: at most its size).
        timeout_s: limit per kernel after its task input exists; past it the worker is killed.
        progress: called as progress(done, total).
        target: 'sm_<capability>', e.g. 'sm_90'.
        compile: False traces only (no compile columns; a Triton module's compile_status is
            'not_run'): a fraction of a second per kernel instead of a compile, for kernels whose
            compile features are known already.
        hardware: the hardware id whose stand-in device the kernels see when they ask
            (pipelines.profiling.standin.DEVICES); None or another id: the target's default.
        cache: rows already read are taken from it, new ones put in it (`FeatureCache`).
        pool: children kept up between calls (`feature_pool`); None starts n_workers for this
            call and stops them at its end.
    Returns:
        One flat row per record (ROW_COLUMNS): status, one-line error, seconds, FEATURE_COLUMNS
        (None where unknown).
    Raises:
        ValueError: `pool` runs other children than this reader's (`feature_pool`).
    """
    if pool is not None and pool.entry != CHILD:
        raise ValueError(f"pool of {' '.join(pool.entry)} children, not the source-feature reader's")
    items = list(records)
    try:
        capability = int(str(target).removeprefix("sm_"))
    except ValueError:
        return [_row(r, target, {"status": "error", "error": f"unknown target {target!r}"}) for r in items]
    results: list[dict | None] = [None] * len(items)
    jobs = [{"source": str(rec.get("source") or ""), "task": str(rec.get("task") or ""),
             "language": str(rec.get("language") or "triton"), "target": [capability, 32],
             "compile": compile, "hardware": hardware} for rec in items]
    keys = [cache.key(job) if cache is not None else "" for job in jobs]
    todo = []
    for i, rec in enumerate(items):
        hit = cache.get(keys[i]) if cache is not None else None
        if hit is not None:
            results[i] = _row(rec, target, hit)
        else:
            todo.append(i)
    done = {"n": len(items) - len(todo)}
    if progress and done["n"]:
        progress(done["n"], len(items))
    if todo:
        own = pool is None
        pool = pool or feature_pool(n_workers)
        try:
            def answer(i: int, msg: dict[str, Any]) -> None:
                if msg.get("status") == "compile_failed":  # the child died or ran out of time
                    msg = {**msg, "status": "failed", "compile_status": "compile_failed"}
                results[i] = _row(items[i], target, msg)
                if cache is not None:
                    cache.put(keys[i], msg)
                done["n"] += 1
                if progress:
                    progress(done["n"], len(items))

            pool.run([(i, jobs[i]) for i in todo], timeout_s, answer, n_workers)
        finally:
            if own:
                pool.close()
    return [r if r is not None else _row(items[i], target, {"status": "error", "error": "not run"})
            for i, r in enumerate(results)]


def feature_pool(size: int = 2) -> CompilePool:
    """Reader children to keep up between calls of `source_features_many` (its `pool`).

    A child imports torch and triton when it starts and builds a task's inputs on its first job
    of that task; a pool pays that once per child instead of once per call.

    Args:
        size: children at most (one per core is what a compile wants).
    """
    return CompilePool(size, CHILD)


# The code and releases a row depends on beyond its job: a change to any of them reads sources anew.
_DECIDING_CODE = ("pipelines/forecasting/source_features.py", "pipelines/generation/aot.py",
                  "pipelines/profiling/standin.py", "pipelines/tasks")
_code_digest: str | None = None


def _feature_code_digest() -> str:
    """sha256 of the feature code (_DECIDING_CODE) and the torch and triton releases, once a process."""
    global _code_digest
    if _code_digest is None:
        from importlib.metadata import PackageNotFoundError, version

        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256()
        for name in _DECIDING_CODE:
            path = root / name
            for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
        for dist in ("torch", "triton"):
            try:
                h.update(f"{dist}=={version(dist)}".encode())
            except PackageNotFoundError:
                h.update(f"{dist}: none".encode())
        _code_digest = h.hexdigest()
    return _code_digest


class FeatureCache:
    """Source-features answers by digest of what decides them, in memory and optionally on disk.

    The key is the sha256 of the job (source, task, language, target, compile, hardware) and of
    the feature code and releases (`_feature_code_digest`). Answers of our own failures (status
    `error`) and of children that crashed or ran out of time (which a less busy machine may not
    repeat) are not kept.

    Args:
        folder: where answers are kept across processes (one small JSON file each); None: this
            process only.
        max_items: answers kept in memory (the oldest go first).
    """

    def __init__(self, folder: str | Path | None = None, max_items: int = 4096):
        self.folder = Path(folder) if folder is not None else None
        self.max_items = max_items
        self._memory: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def key(self, job: Mapping[str, Any]) -> str:
        fields = {k: job.get(k) for k in ("source", "task", "language", "target", "compile", "hardware")}
        payload = json.dumps({"job": fields, "code": _feature_code_digest()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._memory.get(key)
        if hit is None and self.folder is not None:
            try:
                hit = json.loads(self._path(key).read_text())
            except (OSError, ValueError):
                hit = None
            if hit is not None:
                self._remember(key, hit)
        with self._lock:
            if hit is None:
                self.misses += 1
            else:
                self.hits += 1
        return dict(hit) if hit is not None else None

    def put(self, key: str, msg: Mapping[str, Any]) -> None:
        from pipelines.generation.aot import gave_no_answer

        if msg.get("status") not in STATUSES or msg.get("status") == "error" or gave_no_answer(msg.get("error")):
            return
        kept = {k: v for k, v in msg.items() if k != "phase"}
        self._remember(key, kept)
        if self.folder is not None:
            path = self._path(key)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.part")
                tmp.write_text(json.dumps(kept))
                tmp.replace(path)
            except OSError:  # a cache that cannot be written is only slower
                pass

    def _remember(self, key: str, msg: dict[str, Any]) -> None:
        with self._lock:
            self._memory[key] = msg
            while len(self._memory) > self.max_items:
                self._memory.pop(next(iter(self._memory)))

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"


def source_features(task: str, source: str, target: str = "sm_90", language: str = "triton",
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Source features of one kernel module (a one-worker `source_features_many`).

    Args:
        task: the task the module implements.
        source: module source defining custom_kernel(data).
        target: 'sm_90' (H100/H200) or another 'sm_<cc>'.
        language: 'triton' (compiled and traced) or 'pytorch' (traced).
        timeout_s: time limit.
    Returns:
        The row of `source_features_many`.
    """
    rec = {"task": task, "source": source, "language": language}
    return source_features_many([rec], n_workers=1, timeout_s=timeout_s, target=target)[0]


# =============================================================================================
# Child side: compile, trace on fake tensors, aggregate
# =============================================================================================


def _log2(x: float | None) -> float | None:
    return None if x is None else math.log2(1.0 + max(0.0, float(x)))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def occupancy(n_regs: int, num_warps: int, shared_bytes: int) -> float:
    """Resident warps per SM over the SM's maximum (64), from registers, warps and shared memory.

    >>> occupancy(32, 4, 0), occupancy(255, 8, 0), occupancy(64, 4, 120000)
    (1.0, 0.125, 0.0625)
    """
    regs_per_block = max(1, n_regs) * 32 * max(1, num_warps)
    blocks = min(BLOCKS_PER_SM, REGISTERS_PER_SM // regs_per_block, WARPS_PER_SM // max(1, num_warps))
    if shared_bytes > 0:
        blocks = min(blocks, SHARED_PER_SM // shared_bytes)
    return blocks * max(1, num_warps) / WARPS_PER_SM


def aggregate_compile(kernels: list[dict], launch_log: list[dict]) -> dict[str, Any]:
    """Compile columns of a module from aot's per-kernel records and launch log.

    >>> k = [{"n_regs": 40, "stack_bytes": 8, "shared_bytes": 0, "num_warps": 4, "num_stages": 3,
    ...       "ptx": {"ld_global": 2, "fma": 1}}]
    >>> a = aggregate_compile(k, [{"kernel": 0, "weight": 1.0}, {"kernel": 0, "weight": 1.0}])
    >>> a["n_regs"], a["n_spills"], a["ptx_ld_global"], a["ptx_fma"], a["n_launches"]
    (40, 2, 4.0, 2.0, 2)
    """
    out: dict[str, Any] = dict.fromkeys((*COMPILE_COLUMNS, *PTX_COLUMNS))
    if not kernels:
        return out
    weights = [0.0] * len(kernels)
    for launch in launch_log:
        if launch.get("kernel") is not None:
            weights[launch["kernel"]] += float(launch.get("weight") or 0.0)
    if not any(weights):
        weights = [1.0] * len(kernels)
    out.update(n_regs=max(k["n_regs"] for k in kernels), n_spills=max(k["stack_bytes"] // 4 for k in kernels),
               shared_bytes=max(k["shared_bytes"] for k in kernels), n_kernels=len(kernels),
               n_launches=len(launch_log), num_warps=max(k["num_warps"] for k in kernels),
               num_stages=max(k["num_stages"] for k in kernels))
    total = sum(weights)
    out["occupancy"] = sum(w * occupancy(k["n_regs"], k["num_warps"], k["shared_bytes"])
                           for k, w in zip(kernels, weights, strict=True)) / total
    for col in PTX_COLUMNS:
        name = col.removeprefix("ptx_")
        out[col] = float(sum(w * (k.get("ptx") or {}).get(name, 0) for k, w in zip(kernels, weights, strict=True)))
    return out


def wave_efficiency(programs: int, sms: int) -> float:
    """Busy share of the SMs over the waves a launch of `programs` one-SM programs needs.

    >>> wave_efficiency(132, 132), wave_efficiency(133, 132), wave_efficiency(0, 132)
    (1.0, 0.5037878787878788, 0.0)
    """
    if programs <= 0:
        return 0.0
    return programs / (sms * math.ceil(programs / sms))


def aggregate_trace(cases: list[dict], sms: int) -> dict[str, Any]:
    """Trace columns from per-case traces (launch_log, torch counts, input bytes)."""
    out: dict[str, Any] = dict.fromkeys(TRACE_COLUMNS)
    if not cases:
        return out
    launches, programs, arg_bytes, per_prog, waves, warps = [], [], [], [], [], []
    for case in cases:
        log = case["launch_log"]
        n = sum(float(x.get("weight") or 1.0) for x in log)
        p = sum(float(x.get("weight") or 1.0) * x["programs"] for x in log)
        b = sum(float(x.get("weight") or 1.0) * x["arg_bytes"] for x in log)
        launches.append(n)
        programs.append(_log2(p))
        arg_bytes.append(_log2(b))
        if log:
            per_prog.append(_log2(b / max(1.0, p)))
            w = [float(x.get("weight") or 1.0) * max(1, x["programs"]) for x in log]
            waves.append(sum(wi * wave_efficiency(x["programs"], sms) for wi, x in zip(w, log, strict=True)) / sum(w))
            warps.append(sum(wi * x["num_warps"] for wi, x in zip(w, log, strict=True)) / sum(w))
    torch_bytes = [_log2(c["torch_bytes"]) for c in cases]
    flops = [_log2(c["torch_flops"]) for c in cases]
    out.update(
        trace_cases=len(cases), trace_launches=_mean(launches), trace_programs_log2=_mean(programs),
        trace_programs_log2_min=min(programs), trace_programs_log2_max=max(programs),
        trace_arg_bytes_log2=_mean(arg_bytes), trace_bytes_per_program_log2=_mean(per_prog),
        trace_wave_efficiency=_mean(waves), trace_warps=_mean(warps),
        input_bytes_log2=_mean([_log2(c["input_bytes"]) for c in cases]),
        # what the whole call moves at most: its Triton launches' arguments and its torch ops
        call_bytes_log2=_mean([_log2(c["torch_bytes"] + sum(float(x.get("weight") or 1.0) * x["arg_bytes"]
                                                            for x in c["launch_log"])) for c in cases]),
        torch_ops=_mean([c["torch_ops"] for c in cases]), torch_allocs=_mean([c["torch_allocs"] for c in cases]),
        torch_views=_mean([c["torch_views"] for c in cases]),
        torch_distinct_ops=_mean([c["torch_distinct_ops"] for c in cases]),
        torch_flops_log2=_mean(flops), torch_bytes_log2=_mean(torch_bytes),
        torch_intensity_log2=_mean([f - b for f, b in zip(flops, torch_bytes, strict=True)]),
    )
    return out


def _counting_mode():
    """A TorchDispatchMode that counts the ops of a call and the bytes they read and write."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def nbytes(tree) -> int:
        return sum(int(t.numel()) * int(t.element_size()) for t in tree_flatten(tree)[0]
                   if isinstance(t, torch.Tensor))

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = self.allocs = self.views = 0
            self.bytes = 0
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if func.is_view:
                self.views += 1
            elif name.startswith(("empty", "new_empty")):
                self.allocs += 1  # an allocation moves no data
            else:
                self.ops += 1
                self.names.add(name)
                self.bytes += nbytes((args, kwargs)) + nbytes(out)
            return out

    return Counter()


def _input_bytes(data: Any) -> int:
    import torch
    from torch.utils._pytree import tree_flatten

    return sum(int(t.numel()) * int(t.element_size()) for t in tree_flatten(data)[0] if isinstance(t, torch.Tensor))


def _trace_case(module: Any, task: Any, case: Mapping[str, Any], capability: int, workdir: str,
                compile: bool = False) -> dict:
    """One call of the module's custom_kernel on fake tensors of one benchmark case; with
    `compile`, its Triton launches are also compiled for the target (fake tensors bind as
    16-byte-aligned pointers, as real allocations do, so the specialisation is the measured one)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from pipelines.generation.aot import _Capture

    params = dict(case)
    seed = params.pop("seed", 0)
    cap = _Capture(capability, 32, workdir, compile=compile)
    with FakeTensorMode(allow_non_fake_inputs=True):
        data = task.generate_input(seed=seed, **params)
        counter = _counting_mode()
        flops = FlopCounterMode(display=False)
        with cap, torch.no_grad(), flops, counter:
            module.custom_kernel(data)
    return {"launch_log": cap.launch_log, "kernels": cap.kernels, "torch_ops": counter.ops,
            "torch_allocs": counter.allocs, "torch_views": counter.views, "torch_distinct_ops": len(counter.names),
            "torch_bytes": counter.bytes, "torch_flops": flops.get_total_flops(), "input_bytes": _input_bytes(data)}


def _load(source: str, workdir: str, n: int):
    import importlib.util

    name = f"kernelcast_features_{os.getpid()}_{n}"
    path = os.path.join(workdir, name + ".py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit reads the source through the module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return name, module


def _features_job(state: Any, job: dict, send: Callable[[dict], None]) -> None:
    """Answer one job: phase 'input' once the task is known, then the row.

    The first benchmark case's call compiles (Triton modules), every case's call is traced; a
    compile failure is recorded and the cases are traced again without compiling."""
    import warnings

    from pipelines.generation.aot import _one_line as one_line
    from pipelines.generation.aot import _Rejected, _resolve_task, describe
    from pipelines.tasks import gpumode

    warnings.filterwarnings("ignore")  # fake tensors' data_ptr warns on every launch
    start = time.monotonic()
    capability, _ = job["target"]
    triton_module = job.get("language", "triton") == "triton"
    compile_it = triton_module and job.get("compile", True)
    try:
        task = _resolve_task(job["task"])
        cases = list(task.benchmark_cases) or list(task.correctness_cases)[-1:]
    except BaseException as exc:  # noqa: BLE001
        send({"phase": "done", "status": "error", "error": one_line(f"task: {type(exc).__name__}: {exc}"),
              "seconds": time.monotonic() - start})
        return
    send({"phase": "input"})
    t0 = time.monotonic()
    row: dict[str, Any] = {"compile_status": "compiled" if compile_it else "not_run" if triton_module else "skipped"}
    errors: list[str] = []
    traces: list[dict] = []
    state.n += 1
    name = None
    try:
        gpumode.install(task)  # GPU MODE submissions import `task` and `utils`, as in the worker
        name, module = _load(job["source"], state.workdir, state.n)
        if not callable(getattr(module, "custom_kernel", None)):
            raise _NoEntry("module defines no custom_kernel(data)")
        if compile_it:
            try:
                first = _trace_case(module, task, cases[0], capability, state.workdir, compile=True)
                if not first["kernels"]:
                    row["compile_status"] = "compile_failed"
                    errors.append("custom_kernel launched no Triton kernel")
                row.update(aggregate_compile(first["kernels"], first["launch_log"]))
                traces.append(first)
            except _Rejected as exc:
                row["compile_status"] = "rejected"
                errors.append(one_line(f"compile: {exc}"))
            except BaseException as exc:  # noqa: BLE001 - untrusted code
                row["compile_status"] = "compile_failed"
                errors.append(one_line(f"compile: {describe(exc)}"))
        for case in cases[len(traces):]:
            traces.append(_trace_case(module, task, case, capability, state.workdir))
        trace_ok = True
    except _NoEntry as exc:
        errors.append(str(exc))
        trace_ok = False
    except BaseException as exc:  # noqa: BLE001 - untrusted code
        errors.append(one_line(f"{'trace' if name else 'import'}: {type(exc).__name__}: {exc}"))
        trace_ok = False
    finally:
        if name is not None:
            sys.modules.pop(name, None)
    if compile_it and row["compile_status"] == "compiled" and row.get("n_kernels") is None:
        row["compile_status"] = "compile_failed"  # import error or no entry point: nothing compiled
    if trace_ok:
        row.update(aggregate_trace(traces, SM_COUNT.get(capability, 132)))
    compile_ok = row["compile_status"] in ("compiled", "skipped", "not_run")
    status = "ok" if compile_ok and trace_ok else "partial" if compile_ok or trace_ok else "failed"
    if row["compile_status"] in ("skipped", "not_run") and not trace_ok:
        status = "failed"
    row.update(status=status, error=one_line(" | ".join(dict.fromkeys(errors))) or None,
               seconds=time.monotonic() - t0)
    send({"phase": "done", **row})


class _NoEntry(Exception):
    """The module has no custom_kernel."""


def _swap_or_set_data() -> None:
    """Let `module.to(...)` convert parameters made under fake tensors.

    Model code builds `nn.Module`s at call time and moves them (`RMSNorm(d).to(device, dtype)`);
    under a FakeTensorMode torch swaps each parameter for its converted copy, and the swap of a
    fake parameter fails ("Couldn't swap LayerNorm.weight"), so the trace of such a call would
    fail. Where the swap fails the converted values are set as the parameter's data instead, which
    is all a trace needs (shapes and dtypes)."""
    import torch

    swap = torch.utils.swap_tensors

    def swap_or_set_data(t1, t2):
        try:
            return swap(t1, t2)
        except RuntimeError:
            t1.data = t2.data

    torch.utils.swap_tensors = swap_or_set_data


def _install_key_of_triton() -> None:
    """Key Triton's compile cache in this process by its install's identity, not its contents.

    Triton names every cache entry with a digest of its own files, libtriton's shared library
    (hundreds of MB) included, read once per process: 0.4 s of every reader child's first
    compile, a tenth of what `kernelcast forecast` takes for one file. A child's cache is its
    pool's folder alone, so the release and the size and modification time of the same files
    identify the install as well: a Triton replaced under a pool still misses."""
    import triton
    from triton.runtime import autotuner, cache

    root = Path(triton.__file__).resolve().parent
    h = hashlib.sha256(triton.__version__.encode())
    for part in ("runtime/cache.py", "compiler", "backends", "language", "_C"):
        path = root / part
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                st = f.stat()
                h.update(f"{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    key = f"{triton.__version__}-install-{h.hexdigest()}"
    cache.triton_key = autotuner.triton_key = lambda: key


def _child_main() -> None:
    """The compile child's loop (pipelines.generation.aot.serve_compile_jobs) answering feature jobs."""
    from pipelines.generation.aot import serve_compile_jobs

    _swap_or_set_data()
    _install_key_of_triton()
    serve_compile_jobs(_features_job)


# =============================================================================================
# Command line: kernel files in, one features file out (resumable)
# =============================================================================================


def _schema():
    import pyarrow as pa

    fields = [(c, pa.string()) for c in ("kernel_id", "task", "target", "status", "compile_status", "error")]
    fields.append(("seconds", pa.float64()))
    fields += [(c, pa.float64()) for c in FEATURE_COLUMNS]
    return pa.schema(fields)


def read_kernel_files(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Kernel records (kernel_id, task, source, language) of kernel Parquet files, first
    occurrence of each kernel id kept.

    Raises:
        ValueError: a file is unreadable or lacks a column (one line naming it).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen: set[str] = set()
    out = []
    for path in paths:
        try:
            rows = pq.read_table(path, columns=["kernel_id", "task", "source", "language"]).to_pylist()
        except (OSError, pa.ArrowInvalid, KeyError) as exc:
            raise ValueError(f"{path}: {_one_line(str(exc))}") from None
        for r in rows:
            if r["kernel_id"] not in seen:
                seen.add(r["kernel_id"])
                out.append(r)
    return out


def extract_to_file(records: list[dict], out: Path, workers: int, chunk: int = 200, target: str = "sm_90",
                    timeout_s: float = DEFAULT_TIMEOUT_S, log: Callable[[str], None] = print,
                    compile: bool = True) -> int:
    """Features of `records` into `out` (Parquet, zstd), skipping kernels already there; the
    file is rewritten every `chunk` kernels, so a run cut short keeps what it did."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    earlier: list[dict] = pq.read_table(out).to_pylist() if out.is_file() else []
    # our side's failures (a worker that did not start) are tried again, and with compile so are
    # the rows of an earlier trace-only run: those stay in the file until their new row replaces
    # them, so a run cut short loses nothing it had
    done = {r["kernel_id"]: r for r in earlier if r.get("status") != "error"}
    seen = {k for k, r in done.items() if not (compile and r.get("compile_status") == "not_run")}
    # in kernel-id order (a hash: every task in proportion), so a run cut short covers them all
    todo = sorted((r for r in records if r["kernel_id"] not in seen), key=lambda r: str(r["kernel_id"]))
    log(f"{len(todo)} kernels to do ({len(seen)} already in {out})")
    t0 = time.time()
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        rows = source_features_many(part, n_workers=workers, timeout_s=timeout_s, target=target, compile=compile)
        done.update({r["kernel_id"]: {c: r.get(c) for c in schema.names} for r in rows})
        tmp = out.with_name(out.name + ".part")
        pq.write_table(pa.Table.from_pylist(list(done.values()), schema=schema), tmp, compression="zstd")
        tmp.replace(out)
        n = min(start + chunk, len(todo))
        log(f"{n}/{len(todo)} done, {time.time() - t0:.0f} s ({(time.time() - t0) / n:.2f} s per kernel)")
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:] == ["--child"]:
        _child_main()
        return 0
    parser = argparse.ArgumentParser(prog=f"python3 -m {_MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", required=True, help="kernel Parquet files (kernel_id, task, source, language)")
    parser.add_argument("--out", required=True, help="features Parquet (resumed across runs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=200)
    parser.add_argument("--target", default="sm_90")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per kernel")
    parser.add_argument("--limit", type=int, default=None, help="only the first N kernels (a sample)")
    parser.add_argument("--trace-only", action="store_true", help="no compile: the trace's columns only")
    args = parser.parse_args(argv)
    try:
        records = read_kernel_files(args.kernels)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit is not None:
        records = records[: args.limit]
    extract_to_file(records, Path(args.out), args.workers, args.chunk, args.target, args.timeout,
                    log=lambda m: print(m, flush=True), compile=not args.trace_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
