"""Kernel files as kernel records a forecaster reads, or a one-line reason to refuse them.

A file is read as a GPU would run it, not as the CPU can: its module is imported and its
`custom_kernel` traced once per benchmark case on fake CUDA tensors, and a Triton module compiled
for sm_90 on the first case (pipelines.forecasting.source_features), in a child process that runs
on a stand-in device of the hardware forecast for (pipelines.profiling.standin: Triton's driver and
torch.cuda answer with that card's properties). So launchers that ask the device at import or at
call (driver or device properties, `torch.cuda.is_available()`, `torch.cuda.device(...)`,
`device="cuda"` tensors), autotune, or compile ahead with `kernel.warmup` to size a persistent grid
are read like any other. A Triton module whose trace could not compile it (a launcher that reads
values on the host) is compiled on a real input of the first case (pipelines.generation.aot).

A file is refused, in one line naming the cause, only when it
- cannot be read or does not parse,
- defines no `custom_kernel`,
- does not import,
- is a Triton module that does not compile for sm_90 (or exceeds its limits) on the task's input.
Any other trouble (a PyTorch module whose trace failed) is a note: the file is forecast from what
was read.

The CPU check (`check=True`, `kernelcast forecast --check`) also runs the file on the task's small
correctness cases in a sandboxed child under Triton's CPU interpreter (pipelines.profiling.check)
and refuses a file that fails there. The interpreter lacks parts of Triton and of the GPU
(bf16/fp8 arithmetic, libdevice, device queries), so its refusals say that the interpreter, not
the kernel, may be at fault; it is off by default.

Sources held as text (a search's mutations, a request to a served model) are read by
`read_kernel_sources`, the same reading under a name instead of a path. A caller that reads
again and again passes a `feature_pool` (children kept up) and a `FeatureCache` (a source read
once is not read again) of pipelines.forecasting.source_features.

The record leaves generator, algorithm and knobs_json empty: the platform did not write the
file, and no forecaster needs them. It carries every compile feature the compile returns
(`Features.to_row()` less its bookkeeping) and every source feature, whatever the feature set.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENTRY = "custom_kernel"
_TRITON = re.compile(r"@\s*triton\.(?:jit|autotune|heuristics)|\btriton\.jit\(")
# Features.to_row() columns that describe the compile request, not the kernel.
_NOT_FEATURES = ("status", "error", "seconds", "kernels")


@dataclass
class KernelFile:
    """One file (or source): its record when it can be forecast, else why not (one line).

    `path` is None for a source handed over as text (`read_kernel_sources`); `name` is what its
    record's kernel_id says (the path of a file, the given name of a source)."""

    path: Path | None
    record: dict[str, Any] | None = None
    refused: str | None = None
    notes: list[str] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name and self.path is not None:
            self.name = str(self.path)


def language_of(source: str) -> str:
    """'triton' for a module with a @triton.jit (or autotuned) function, else 'pytorch'."""
    return "triton" if _TRITON.search(source) else "pytorch"


def static_refusal(source: str) -> str | None:
    """Why a source cannot be a kernel module, read without running it (None: it may be one)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # null bytes
        return f"not Python source: {exc}"
    names: set[str] = set()
    star = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            star |= any(a.name == "*" for a in node.names)
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if ENTRY not in names and not star:
        return f"defines no {ENTRY}(data): not a kernel module"
    return None


_INTERPRETER = ("on Triton's CPU interpreter, which may be at fault rather than the kernel "
                "(forecast without --check to read it as the GPU would)")


def _check_line(kind: str | None, message: str) -> str:
    what = {"compile_failed": "does not import", "runtime_error": "raises on the task's correctness input",
            "incorrect": "gives wrong results on the task's correctness input",
            "crashed": "crashed its checking process", "tampered": "tampered with its check"}.get(kind or "", kind)
    if kind in ("runtime_error", "incorrect", "crashed"):
        return f"{what} {_INTERPRETER}: {message}"
    return f"{what}: {message}"


def read_kernel_files(task: str, paths: Sequence[Path], *, check: bool = False, check_timeout_s: float = 60.0,
                      compile: bool = True, compile_timeout_s: float = 120.0, allow_incorrect: bool = False,
                      n_workers: int = 2, all_needed: bool = False, hardware: str | None = None,
                      cache: Any = None, pool: Any = None) -> list[KernelFile]:
    """A KernelFile per path, in order (the work of the checks and compiles spread over n_workers).

    Args:
        task: a task name of the suite (pipelines.tasks.get_task raises on an unknown one).
        paths: kernel module files.
        check: also run the sandboxed correctness check on the CPU interpreter (module docstring).
        check_timeout_s: per file; a check that takes longer is a note, not a refusal.
        compile: read each file (import, trace, sm_90 compile); False: the static reading only.
        allow_incorrect: forecast a file the check finds wrong (a note instead of a refusal).
        all_needed: the caller needs every file (one anchor, one candidate): once a stage (the
            static reading, the checks) refuses one, the later stages are not run and no file
            gets a record, so the refusal is known in a moment instead of after every compile.
        hardware: the hardware id forecast for: its stand-in device answers the files' device
            queries (pipelines.profiling.standin.DEVICES; another id or None: the H200).
        cache: a source_features.FeatureCache: a source read before is not read again.
        pool: a source_features.feature_pool() whose children stay up between calls.
    """
    files = [KernelFile(Path(p)) for p in paths]
    sources: dict[int, str] = {}
    for i, f in enumerate(files):
        try:
            sources[i] = f.path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            f.refused = f"cannot be read: {type(exc).__name__}: {exc}".splitlines()[0]
    return _read(task, files, sources, check=check, check_timeout_s=check_timeout_s, compile=compile,
                 compile_timeout_s=compile_timeout_s, allow_incorrect=allow_incorrect, n_workers=n_workers,
                 all_needed=all_needed, hardware=hardware, cache=cache, pool=pool)


def read_kernel_sources(task: str, sources: Sequence[str], hardware: str | None = None, *,
                        names: Sequence[str] | None = None, check: bool = False, check_timeout_s: float = 60.0,
                        compile: bool = True, compile_timeout_s: float = 120.0, allow_incorrect: bool = False,
                        n_workers: int = 2, all_needed: bool = False, cache: Any = None,
                        pool: Any = None) -> list[KernelFile]:
    """`read_kernel_files` for sources held as text (a search's mutations, a service's request):
    the same reading, the same refusals, one KernelFile per source (its `path` None).

    Args:
        task, hardware, check, check_timeout_s, compile, compile_timeout_s, allow_incorrect,
            n_workers, all_needed, cache, pool: as `read_kernel_files`.
        sources: kernel module sources.
        names: each source's kernel_id in its record (default: source-0, source-1, ...).
    """
    if names is not None and len(names) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(names)} names")
    files = [KernelFile(None, name=str(names[i]) if names is not None else f"source-{i}")
             for i in range(len(sources))]
    texts = {}
    for i, (f, text) in enumerate(zip(files, sources, strict=True)):
        if isinstance(text, str):
            texts[i] = text
        else:
            f.refused = f"not a source text: {type(text).__name__}"
    return _read(task, files, texts, check=check, check_timeout_s=check_timeout_s, compile=compile,
                 compile_timeout_s=compile_timeout_s, allow_incorrect=allow_incorrect, n_workers=n_workers,
                 all_needed=all_needed, hardware=hardware, cache=cache, pool=pool)


def _read(task: str, files: list[KernelFile], sources: dict[int, str], *, check: bool, check_timeout_s: float,
          compile: bool, compile_timeout_s: float, allow_incorrect: bool, n_workers: int, all_needed: bool,
          hardware: str | None, cache: Any, pool: Any) -> list[KernelFile]:
    """The reading every entry point shares: `sources` holds the text of each file not refused yet."""
    from pipelines.tasks import TASK_MODULES

    if task not in TASK_MODULES:  # as get_task says it, without loading the task here: the children do
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASK_MODULES)}")
    for i, f in enumerate(files):
        if f.refused is None:
            f.refused = static_refusal(sources[i])
    live = [i for i, f in enumerate(files) if f.refused is None]
    if all_needed and len(live) < len(files):
        return files
    if check and live:
        from pipelines.profiling.check import check_sources

        outcomes = _once_per_source(live, sources, lambda first: check_sources(
            [(task, sources[i]) for i in first], n_workers=min(n_workers, len(first)), timeout_s=check_timeout_s))
        for i, o in zip(live, outcomes, strict=True):
            if o.ok:
                continue
            if o.failure_kind == "timeout":
                files[i].notes.append(f"not checked: the CPU check took over {check_timeout_s:g} s")
            elif o.failure_kind == "incorrect" and allow_incorrect:
                files[i].notes.append(_check_line(o.failure_kind, o.message))
            else:
                files[i].refused = _check_line(o.failure_kind, o.message)
        live = [i for i in live if files[i].refused is None]
        if all_needed and len(live) < len(files):
            return files
    for i in live:
        files[i].record = {"kernel_id": files[i].name, "task": task, "source": sources[i],
                           "language": language_of(sources[i]), "generator": None, "algorithm": None,
                           "knobs_json": None}
    if compile:
        _add_compiled_features(task, [files[i] for i in live], n_workers, compile_timeout_s, hardware, cache, pool)
    return files


def _once_per_source(indices: list[int], sources: dict[int, str], run: Any) -> list[Any]:
    """`run` on the first file of each distinct source among `indices`, its result handed to
    every file of that source, in the order of `indices`: the check, the compile and the source
    features depend on the source alone, so a file given twice (an anchor that is also a
    candidate, a copy in a folder) is read once."""
    first: dict[str, int] = {}
    for i in indices:
        first.setdefault(sources[i], i)
    done = dict(zip(first.values(), run(list(first.values())), strict=True))
    return [done[first[sources[i]]] for i in indices]


# source_features rows' columns that are bookkeeping, not features of the kernel
_SOURCE_BOOKKEEPING = ("kernel_id", "task", "target", "status", "compile_status", "error", "seconds")


def _add_compiled_features(task: str, files: list[KernelFile], n_workers: int, compile_timeout_s: float,
                           hardware: str | None = None, cache: Any = None, pool: Any = None) -> None:
    """Give each file the features its measured twin has in the warehouse
    (warehouse.kernels.forecast_features: the compile's, overlaid with an ok or partial source
    features row), or refuse a file that does not import, or a Triton file that does not compile
    for sm_90.

    One source-features child compiles each Triton file on the first benchmark case as the
    generator's compile does (the same capture, the same rejections) and traces every case, so a
    file that compiles costs one child and one compile. Where that compile did not succeed (its
    trace runs on fake tensors, which a kernel reading values on the host cannot take), the
    generator's own compile on a real input decides, as for a generated kernel; a child that hung
    or crashed on a Triton file refuses it at once (another would do the same)."""
    if not files:
        return
    from pipelines.forecasting.source_features import source_features_many
    from pipelines.generation.aot import gave_no_answer

    sources = {i: f.record["source"] for i, f in enumerate(files)}
    rows = _once_per_source(list(sources), sources, lambda first: source_features_many(
        [files[i].record for i in first], n_workers=min(n_workers, len(first)),
        timeout_s=compile_timeout_s, hardware=hardware, cache=cache, pool=pool))
    for f, row in zip(files, rows, strict=True):
        import_error = _import_error(row["error"])
        if import_error:
            f.refused, f.record = f"does not import: {import_error}", None
        elif f.record["language"] == "triton" and gave_no_answer(row["error"]):  # a second child would hang too
            f.refused = f"the sm_90 compile on the task's benchmark input failed: {row['error']}"
            f.record = None
    unsure = [i for i, f in enumerate(files) if f.record is not None and f.record["language"] == "triton"
              and rows[i]["compile_status"] != "compiled"]
    if unsure:
        feats = _once_per_source(unsure, sources, lambda first: _compile_on_real_input(
            [files[i].record for i in first], min(n_workers, len(first)), compile_timeout_s, cache))
        for i, f in zip(unsure, feats, strict=True):
            if f.status == "compiled":
                files[i].record.update({k: v for k, v in f.to_row().items() if k not in _NOT_FEATURES})
            elif f.status == "error":  # our side failed: the file is not to blame
                files[i].notes.append(f"no compile features: {f.error}")
            else:
                files[i].refused = (f"does not fit sm_90: {f.error}" if f.status == "rejected"
                                    else f"the sm_90 compile on the task's benchmark input failed: {f.error}")
                files[i].record = None
    for f, row in zip(files, rows, strict=True):
        if f.record is None:
            continue
        if row["status"] in ("ok", "partial"):
            f.record.update({k: v for k, v in row.items() if k not in _SOURCE_BOOKKEEPING})
        else:
            f.notes.append(f"no source features: {row['error']}")


def _compile_on_real_input(records: list[dict[str, Any]], n_workers: int, timeout_s: float, cache: Any) -> list[Any]:
    """pipelines.generation.aot.compile_many of `records`, each answer kept in `cache` (a
    FeatureCache, or None) beside the source-features rows, so a source whose trace could not
    compile it is compiled on a real input once, not on every reading."""
    from pipelines.generation.aot import Features, compile_many

    jobs = [{"source": r["source"], "task": r["task"], "language": "triton", "target": "aot:benchmark"}
            for r in records]
    keys = [cache.key(job) if cache is not None else "" for job in jobs]
    held = [cache.get(k) if cache is not None else None for k in keys]
    out: list[Any] = [None] * len(records)
    for i, h in enumerate(held):
        if h is not None:
            out[i] = Features(**{**h["features"], "kernels": tuple(h["features"].get("kernels") or ())})
    todo = [i for i, f in enumerate(out) if f is None]
    if todo:
        for i, f in zip(todo, compile_many([records[i] for i in todo], n_workers=n_workers, timeout_s=timeout_s),
                        strict=True):
            out[i] = f
            if cache is not None:  # as a cache row: a status it keeps, the compile's outcome inside
                cache.put(keys[i], {"status": "ok" if f.status == "compiled" else "failed" if f.status != "error"
                                    else "error", "error": f.error, "features": {**asdict(f), "kernels": list(f.kernels)}})
    return out


def _import_error(error: str | None) -> str | None:
    """The import failure a source-features row names ('import: ...' first), else None."""
    if not error:
        return None
    first = error.split(" | ")[0]
    return first.removeprefix("import: ") if first.startswith("import: ") else None
