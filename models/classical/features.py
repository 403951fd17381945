"""What a classical forecaster sees of a kernel pair: kernel records in, a feature table out.

A *kernel record* is a mapping with the warehouse's kernel columns (kernel_id, task, source,
language, generator, algorithm, knobs_json) and, when known, the sm_90 compile features
(n_regs, n_spills, shared_bytes, n_kernels, n_launches). A *pair frame* has one row per
(anchor, candidate) with the columns `task` and every kernel column twice, prefixed `a_`
(anchor) and `c_` (candidate): `pair_frame` builds it, and it is the input signature of every
classical model in the registry, so a model logged to MLflow can be called on any pair.

Nothing here runs a kernel or reads a measured runtime: knobs and algorithm come from the
generator's record, compile features from compiling for the target, source counts from the
text. LLM-written kernels have no knobs; their knob columns are missing (NaN), and the text
model (models.classical.text_model) reads them as well as any other.

Only pandas and numpy: the same code runs on a GPU host without polars (the live search).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

KERNEL_FIELDS = ("kernel_id", "source", "language", "generator", "algorithm", "knobs_json")
# What the generator says about its own kernels: optional, never needed (external kernels lack it).
METADATA_FIELDS = ("generator", "algorithm", "knobs_json")
# Derived from the source alone (pipelines.forecasting.source_features.FEATURE_COLUMNS, listed
# here because models import no pipelines): the sm_90 compile (resources, PTX instruction mix)
# and the trace of one call per benchmark shape (launches, programs, bytes, torch ops). The first
# five are also the older compile-features files' columns.
COMPILE_FIELDS = (
    "n_regs", "n_spills", "shared_bytes", "n_kernels", "n_launches", "num_warps", "num_stages", "occupancy",
    "ptx_ld_global", "ptx_st_global", "ptx_ld_shared", "ptx_st_shared", "ptx_ldmatrix", "ptx_vec2", "ptx_vec4",
    "ptx_mma", "ptx_wgmma", "ptx_barrier", "ptx_cp_async", "ptx_cp_async_bulk", "ptx_atomic", "ptx_ex2",
    "ptx_fma", "ptx_cvt_fp8", "ptx_cvt_bf16", "ptx_branch", "ptx_shfl", "ptx_instructions",
    "ptx_ld_global_bytes", "ptx_st_global_bytes",
    "trace_cases", "trace_launches", "trace_programs_log2", "trace_programs_log2_min", "trace_programs_log2_max",
    "trace_arg_bytes_log2", "trace_bytes_per_program_log2", "trace_wave_efficiency", "trace_warps",
    "input_bytes_log2", "call_bytes_log2", "torch_ops", "torch_allocs", "torch_views", "torch_distinct_ops",
    "torch_flops_log2", "torch_bytes_log2", "torch_intensity_log2",
)
SIDES = ("a", "c")  # anchor, candidate

# Source constructs whose counts tell algorithms apart (regex over comment-free code).
SOURCE_COUNTS: dict[str, str] = {
    "jit_functions": r"@triton\.jit",
    "autotune": r"@triton\.autotune",
    "tl_dot": r"\btl\.dot\b",
    "tl_load": r"\btl\.load\b",
    "tl_store": r"\btl\.store\b",
    "tl_atomic": r"\btl\.atomic_\w+",
    "tl_reduce": r"\btl\.(?:sum|max|min|reduce|cumsum)\b",
    "loops": r"\bfor\b.+\bin\b",
    "launches": r"\w+\[\s*(?:grid|\()",
    "torch_calls": r"\btorch\.(?!float|bfloat|int|uint|bool|Tensor|empty|zeros|ones|device|cuda)\w+\(",
    "exp2": r"\bexp2\b",
    "exp": r"\btl\.exp\b",
    "fp8": r"float8",
    "lines": r"\n",
    # schedule and memory-access constructs any Triton author writes
    "tl_range": r"\btl\.(?:range|static_range)\b",
    "num_programs": r"\btl\.num_programs\b",  # persistent grids
    "program_id_2d": r"\btl\.program_id\(\s*[12]\s*\)",
    "block_ptr": r"\btl\.(?:make_block_ptr|advance)\b",
    "tensor_descriptor": r"\b(?:make_tensor_descriptor|TensorDescriptor|_experimental_descriptor)\w*",
    "eviction": r"\beviction_policy\s*=",
    "cache_modifier": r"\bcache_modifier\s*=",
    "tl_where": r"\btl\.where\b",
    "mask": r"\bmask\s*=",
    "fp32_cast": r"\.to\(\s*tl\.float32\s*\)",
    "math_fn": r"\b(?:tanh|erf|sigmoid|rsqrt|sqrt|log2?)\b",
    "tl_dot_scaled": r"\btl\.dot_scaled\b",
    "atomic_add": r"\batomic_add\b",
    "torch_alloc": r"\btorch\.(?:empty|zeros|ones|full)(?:_like)?\(",
    "torch_compile": r"\btorch\.compile\b",
    "contiguous": r"\.contiguous\(",
    "jit_calls": r"\w+\[\s*[\w(]",
}
# Per count, literals one of which every match contains (the `kernel_features` fast path; a
# test checks the counts equal the plain regex counts on every committed kernel).
_GATES: dict[str, tuple[str, ...]] = {
    "jit_functions": ("@triton.jit",), "autotune": ("@triton.autotune",), "tl_dot": ("tl.dot",),
    "tl_load": ("tl.load",), "tl_store": ("tl.store",), "tl_atomic": ("tl.atomic_",), "tl_reduce": ("tl.",),
    "loops": ("for",), "launches": ("[",), "torch_calls": ("torch.",), "exp2": ("exp2",), "exp": ("tl.exp",),
    "fp8": ("float8",), "lines": ("\n",), "tl_range": ("tl.",), "num_programs": ("tl.num_programs",),
    "program_id_2d": ("tl.program_id",), "block_ptr": ("tl.make_block_ptr", "tl.advance"),
    "tensor_descriptor": ("make_tensor_descriptor", "TensorDescriptor", "_experimental_descriptor"),
    "eviction": ("eviction_policy",), "cache_modifier": ("cache_modifier",), "tl_where": ("tl.where",),
    "mask": ("mask",), "fp32_cast": (".to(",), "math_fn": ("tanh", "erf", "sigmoid", "sqrt", "log"),
    "tl_dot_scaled": ("tl.dot_scaled",), "atomic_add": ("atomic_add",), "torch_alloc": ("torch.",),
    "torch_compile": ("torch.compile",), "contiguous": (".contiguous(",), "jit_calls": ("[",),
}
_COUNTERS = {name: (_GATES[name], re.compile(pattern)) for name, pattern in SOURCE_COUNTS.items()}
_WORD_CHAR = re.compile(r"\w")


def _counter(pattern: re.Pattern) -> Callable[[str], int]:
    """A function giving `len(pattern.findall(code))`, faster for the two shapes most counts have.

    Why: Python's regex engine skips ahead to a pattern's literal prefix with a fast scan, but a
    pattern opening with `\\b` or `\\w+` has none, so it is tried at every character (those
    counts were about three quarters of kernel_features' time). For `\\b<rest>` the leftmost
    match starts where `<rest>` (literal prefix, fast) first matches with the pattern matching
    there too; for `\\w+<rest>` it starts at the word run (from the scan position on) that ends
    where `<rest>` matches. Each candidate is confirmed by matching the whole pattern there, and
    the scan goes on after it as findall's does, so the counts are findall's (a test compares
    them on committed kernels and on edge cases).
    """
    text = pattern.pattern
    if text.startswith(r"\b"):
        rest, back = re.compile(text[2:]), False
    elif text.startswith("\\w+\\") and not text[4].isalnum():  # `rest` opens with an escaped non-word character
        rest, back = re.compile(text[3:]), True
    else:
        return lambda code: len(pattern.findall(code))

    def count(code: str) -> int:
        n = pos = 0
        while (m := rest.search(code, pos)) is not None:
            start = m.start()
            if back:  # the word run before `rest`, not reaching back past the scan position
                begin = start
                while begin > pos and _WORD_CHAR.match(code, begin - 1):
                    begin -= 1
                found = pattern.match(code, begin) if begin < start else None
            else:
                found = pattern.match(code, start)
            if found is None:
                pos = start + 1
            else:
                n += 1
                pos = found.end() if found.end() > found.start() else found.end() + 1
        return n

    return count


_COUNT = {name: _counter(pattern) for name, (_, pattern) in _COUNTERS.items()}
# A module-level integer constant (`BLOCK_M = 128`) or an integer keyword of a launch or config
# (`num_warps=8`, `"BLOCK": 256`): the tile sizes, warps and stages any author writes as numbers.
_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*)\s*(?::\s*\w+\s*)?=\s*(\d+)\s*$", re.MULTILINE)
_KEYWORD = re.compile(r"""(?:\b|["'])(num_warps|num_stages|num_ctas|[A-Z][A-Z0-9_]*)["']?\s*[=:]\s*(\d+)\b""")
_COMMENT = re.compile(r"#[^\n]*")
_JIT_NAME = re.compile(r"@triton\.jit[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+(\w+)")
_DOCSTRING = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'')


def code_text(source: str) -> str:
    """Source without comments and docstrings (what the counts and the text model read).

    >>> code_text('x = 1  # one\\n')
    'x = 1  \\n'
    """
    return _COMMENT.sub("", _DOCSTRING.sub("", source or ""))


def knobs_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's knob values ({} for the reference, LLM kernels or unreadable JSON)."""
    raw = record.get("knobs_json")
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        knobs = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        return {}
    return knobs if isinstance(knobs, dict) else {}


def _number(value: Any) -> float:
    """A float for numeric values and NaN for missing or non-finite ones."""
    if value is None or isinstance(value, bool):
        return float(value) if isinstance(value, bool) else math.nan
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def kernel_features(record: Mapping[str, Any]) -> dict[str, Any]:
    """Flat features of one kernel record: family, knobs, compile features, source counts.

    Keys: `family` (task/algorithm, or task/<generator> without an algorithm), `generator`,
    `knob:<NAME>` per knob (numbers stay numbers, other values become strings), the compile and
    trace features (NaN when unknown), `work:` features derived from the trace (`work_features`)
    and `src:<construct>` counts.

    >>> f = kernel_features({"task": "softmax", "algorithm": "two_pass", "generator": "kernelcast-space",
    ...                      "knobs_json": '{"BLOCK_N": 256, "exp_impl": "exp2"}', "source": "tl.load(x)\\n"})
    >>> f["family"], f["knob:BLOCK_N"], f["knob:exp_impl"], f["src:tl_load"]
    ('softmax/two_pass', 256.0, 'exp2', 1)
    """
    task = str(record.get("task") or "")
    generator = str(record.get("generator") or "unknown")
    algorithm = record.get("algorithm")
    kind = "reference" if generator == "reference" else generator.split(":")[0]
    out: dict[str, Any] = {
        "family": f"{task}/{algorithm if algorithm else kind}",
        "generator": kind,
    }
    for name, value in knobs_of(record).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"knob:{name}"] = _number(value)
        else:
            out[f"knob:{name}"] = str(value)
    for name in COMPILE_FIELDS:
        out[name] = _number(record.get(name))
    out.update(work_features(out))
    out.update(source_features(str(record.get("source") or "")))
    return out


WORK_PREFIX = "work:"


def work_ratio(frame: pd.DataFrame, name: str = "work:time_log2") -> np.ndarray:
    """Per pair of a pair frame, the candidate's `work_features` value minus the anchor's (NaN where
    either is unknown): for the log2 features, the log ratio of candidate to anchor.

    For `work:time_log2` the two estimates share the task's arithmetic (`pair_work_times`): the
    trace counts only torch ops' flops, so a kernel that does its matrix products in Triton kernels
    would otherwise look as if it did none against an anchor whose cuBLAS products are counted."""
    c = _features_of(side_records(frame, "c"))
    a = _features_of(side_records(frame, "a"))
    if name == "work:time_log2":
        return np.array([tc - ta for tc, ta in (pair_work_times(fc, fa) for fc, fa in zip(c, a, strict=True))],
                        dtype=np.float64)
    return np.array([_number(fc.get(name)) - _number(fa.get(name)) for fc, fa in zip(c, a, strict=True)],
                    dtype=np.float64)


# Peak rates of an sm_90 card (H100 SXM5 datasheet: 3.35 TB/s HBM3; 989 TFLOPS of dense bf16/fp16
# on tensor cores; 67 TFLOPS of fp32 on the CUDA cores) for `work_features`' time estimate. Only
# their proportions matter: the candidate-minus-anchor difference of the estimate's log (a log
# ratio) cancels the rates where one term dominates both kernels, and the trees never read it.
_BYTES_PER_S = 3.35e12
_TENSOR_FLOPS_PER_S = 9.89e14  # matrix products on tensor cores (16-bit operands)
_CUDA_CORE_FLOPS_PER_S = 6.7e13  # fp32 arithmetic off the tensor cores
_LAUNCH_S = 5e-6  # host and launch cost of one kernel (a torch op or a Triton launch)


def work_features(fields: Mapping[str, Any]) -> dict[str, float]:
    """What one call costs, the same way for a PyTorch program and a Triton module, from the
    trace columns (pipelines.forecasting.source_features): NaN where the trace is unknown.

    - `work:launches_log2`: log2(1 + kernels launched per call), the Triton launches plus the torch
      ops (every torch op that is not a view or an allocation launches about one kernel);
    - `work:traffic_log2`: log2 of the bytes the call moves over its input's bytes (upcasts,
      intermediates written and read again);
    - `work:time_log2`: log2 of a roofline estimate of the call in microseconds (`_time_log2`):
      bytes over a bandwidth or the traced flops over the tensor-core rate, whichever is longer,
      or a fixed cost per launch if that is (only torch ops' flops are traced: `pair_work_times`
      adds what a pair's other kernel shows);
    - `work:bytes_log2`, `work:launches`, `work:flops_log2`: the terms of that estimate (no traced
      flops count as none in it);
    - `work:tensor_cores`: 1 where the compiled PTX has tensor-core instructions (mma, wgmma),
      0 where it has none, NaN where nothing was compiled (a PyTorch program).

    Their candidate-minus-anchor differences (the `d:` columns of FeatureSpace) are log ratios:
    a program of a dozen launches against a reference of one, or one that moves twice the bytes.

    >>> w = work_features({"trace_launches": 1.0, "torch_ops": 2.0, "call_bytes_log2": 30.0,
    ...                    "input_bytes_log2": 29.0, "torch_flops_log2": 0.0})
    >>> w["work:launches_log2"], w["work:traffic_log2"], round(w["work:time_log2"], 2)
    (2.0, 1.0, 8.32)
    """
    launches_parts = [_number(fields.get(k)) for k in ("trace_launches", "torch_ops")]
    known = [v for v in launches_parts if v == v]
    launches = sum(known) if known else math.nan
    nbytes, inputs, flops = (_number(fields.get(k)) for k in ("call_bytes_log2", "input_bytes_log2", "torch_flops_log2"))
    mma = [_number(fields.get(k)) for k in ("ptx_mma", "ptx_wgmma")]
    compiled = _number(fields.get("ptx_instructions"))
    tensor = 1.0 if any(v > 0 for v in mma) else (0.0 if compiled > 0 else math.nan)
    out = {"work:launches_log2": math.log2(1.0 + launches) if launches == launches else math.nan,
           "work:traffic_log2": nbytes - inputs, "work:time_log2": math.nan, "work:bytes_log2": nbytes,
           "work:launches": launches, "work:flops_log2": flops, "work:tensor_cores": tensor}
    if nbytes == nbytes and launches == launches:
        out["work:time_log2"] = _time_log2(nbytes, launches, 2.0 ** flops - 1.0 if flops == flops else 0.0, 0.0, tensor)
    return out


def _time_log2(nbytes_log2: float, launches: float, traced_flops: float, hidden_flops: float, tensor: float) -> float:
    """log2 of the roofline estimate in microseconds: the device's time, the larger of the bytes
    over the bandwidth and the arithmetic over its units' rates (traced flops, torch's matrix
    products, on tensor cores; flops the trace does not see on the units that do them), or the
    host's, a fixed cost per launch, whichever is longer: launches are asynchronous, so the host
    queues the next kernel while the device runs the last, and a call of many small ops waits
    on the host."""
    hidden_rate = _CUDA_CORE_FLOPS_PER_S if tensor == 0.0 else _TENSOR_FLOPS_PER_S
    device = max((2.0 ** nbytes_log2 - 1.0) / _BYTES_PER_S, traced_flops / _TENSOR_FLOPS_PER_S + hidden_flops / hidden_rate)
    seconds = max(device, launches * _LAUNCH_S)
    return math.log2(max(seconds * 1e6, 1e-3))


def pair_work_times(fc: Mapping[str, Any], fa: Mapping[str, Any]) -> tuple[float, float]:
    """The `work:time_log2` estimates of a pair's candidate and anchor (their `work_features`),
    both counting the task's arithmetic: NaN where a side's trace is unknown.

    Both kernels compute the same output, so both do at least the arithmetic the larger traced
    count shows. The trace counts only the flops of torch's matrix products (FlopCounterMode), so
    a side that shows fewer does the rest where the trace cannot see: in its Triton kernels, on
    tensor cores if its PTX has tensor-core instructions and on the CUDA cores if it has none; in a
    PyTorch program, in elementwise ops and reductions (a product written as a broadcast multiply
    and a sum), on the CUDA cores.

    >>> def kernel(**fields): return {**fields, **work_features(fields)}
    >>> ref = kernel(trace_launches=0.0, torch_ops=3.0, call_bytes_log2=28.0, torch_flops_log2=36.0)
    >>> mma = kernel(trace_launches=1.0, torch_ops=1.0, call_bytes_log2=27.0, ptx_instructions=900.0, ptx_wgmma=8.0)
    >>> fma = kernel(trace_launches=1.0, torch_ops=1.0, call_bytes_log2=27.0, ptx_instructions=900.0)
    >>> [round(t - a, 2) for t, a in (pair_work_times(mma, ref), pair_work_times(fma, ref))]
    [-0.21, 3.68]
    """
    c_flops, a_flops = (2.0 ** f["work:flops_log2"] - 1.0 if f.get("work:flops_log2") == f.get("work:flops_log2")
                        else 0.0 for f in (fc, fa))
    task_flops = max(c_flops, a_flops)
    out = []
    for f, traced in ((fc, c_flops), (fa, a_flops)):
        nbytes, launches = _number(f.get("work:bytes_log2")), _number(f.get("work:launches"))
        if nbytes != nbytes or launches != launches:
            out.append(math.nan)
            continue
        triton = _number(f.get("trace_launches")) > 0
        tensor = _number(f.get("work:tensor_cores")) if triton else 0.0  # a program's unseen flops: CUDA cores
        out.append(_time_log2(nbytes, launches, traced, task_flops - traced, tensor))
    return out[0], out[1]


# source_features of the sources this process has seen, by their text: a kernel's record comes
# with and without its generator metadata (the cost model's metadata dropout, the source-only
# split), and the regular expressions over its code are most of kernel_features' time.
_SOURCE_FEATURES: dict[str, dict[str, Any]] = {}
_SOURCE_FEATURES_MAX = 50_000


def source_features(source: str) -> dict[str, Any]:
    """The features of a kernel's source text alone: `src:<construct>` counts, `const:<NAME>`
    constants and `jit_names` (kernel_features' part that needs no record). The dict is shared
    between calls with the same source: callers copy it, never change it.

    >>> f = source_features("@triton.jit\\ndef k(x):\\n    tl.load(x)\\nBLOCK = 64\\n")
    >>> f["src:tl_load"], f["const:BLOCK"], f["jit_names"]
    (1, 64.0, 'k')
    """
    found = _SOURCE_FEATURES.get(source)
    if found is not None:
        return found
    code = code_text(source)
    out: dict[str, Any] = {}
    for name, (gates, _) in _COUNTERS.items():
        # A construct whose every match holds one of its literals counts 0 without a regex scan
        # when none is in the code (a `str` search is a fast scan; `\b` patterns are not).
        out[f"src:{name}"] = _COUNT[name](code) if any(g in code for g in gates) else 0
    out.update({f"const:{k}": v for k, v in source_constants(code).items()})
    # the names of the module's @triton.jit functions: how its author decomposed the work (the
    # generator's algorithms differ in them; a name never seen at fit time reads as missing)
    out["jit_names"] = "|".join(sorted(set(_JIT_NAME.findall(code)))) or "none"
    if len(_SOURCE_FEATURES) >= _SOURCE_FEATURES_MAX:
        _SOURCE_FEATURES.clear()
    _SOURCE_FEATURES[source] = out
    return out


def source_constants(code: str) -> dict[str, float]:
    """Integer constants a kernel's code spells out: module-level UPPER_CASE assignments and
    integer keywords of launches and autotune configs (num_warps, num_stages, UPPER_CASE names);
    a name given several values keeps the largest (an autotune list's widest config).

    >>> source_constants("BLOCK_M = 128\\nk[grid](x, BLOCK_N=64, num_warps=8)\\ncfg = {'BLOCK_N': 256}\\n")
    {'BLOCK_M': 128.0, 'BLOCK_N': 256.0, 'num_warps': 8.0}
    """
    out: dict[str, float] = {}
    for pattern in (_CONSTANT, _KEYWORD):
        for name, value in pattern.findall(code):
            out[name] = max(out.get(name, 0.0), float(value))
    return dict(sorted(out.items()))


def without_metadata(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as a user's file gives it: generator metadata (METADATA_FIELDS) withheld."""
    return {**record, **dict.fromkeys(METADATA_FIELDS)}


def withhold_metadata(frame: pd.DataFrame, rows: np.ndarray | None = None) -> pd.DataFrame:
    """A copy of a pair frame with both sides' generator metadata withheld on `rows` (a boolean
    mask; None: every row)."""
    out = frame.copy()
    mask = np.ones(len(frame), dtype=bool) if rows is None else np.asarray(rows, dtype=bool)
    for side in SIDES:
        for f in METADATA_FIELDS:
            col = f"{side}_{f}"
            if col in out.columns:
                out[col] = out[col].astype(object).where(~mask, None)
    return out


def dropout_rows(frame: pd.DataFrame, fraction: float, seed: int = 0) -> np.ndarray:
    """A deterministic boolean mask choosing about `fraction` of a pair frame's rows, by a hash
    of (seed, anchor id, candidate id): the same pair is chosen in every run and every order."""
    if fraction <= 0:
        return np.zeros(len(frame), dtype=bool)
    if fraction >= 1:
        return np.ones(len(frame), dtype=bool)
    keys = zip(frame["a_kernel_id"].astype(str), frame["c_kernel_id"].astype(str), strict=True)
    u = [int(hashlib.sha256(f"{seed}|{a}|{c}".encode()).hexdigest()[:8], 16) / 2**32 for a, c in keys]
    return np.asarray(u) < fraction


def scale_keys(frame: pd.DataFrame) -> list[str]:
    """The key of each pair's forecast spread: its task, plus '|bare' when the candidate carries
    no generator metadata (forecasts from the source alone are less sharp)."""
    meta = has_metadata(frame)
    return [f"{t}" if m else f"{t}|bare" for t, m in zip(frame["task"].astype(str), meta, strict=True)]


def has_metadata(frame: pd.DataFrame) -> np.ndarray:
    """Per pair: whether the candidate carries generator metadata (an algorithm or knobs)."""
    alg = frame.get("c_algorithm", pd.Series([None] * len(frame), index=frame.index))
    knobs = frame.get("c_knobs_json", pd.Series([None] * len(frame), index=frame.index))
    return (alg.notna() | knobs.notna()).to_numpy()


def with_compile_features(record: Mapping[str, Any], features: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`record` with the compile features `features` knows for its kernel id filled in where it
    has none (the search's kernel records carry only what the generator knows)."""
    out = dict(record)
    for k, v in features.get(str(record.get("kernel_id")), {}).items():
        if out.get(k) is None:
            out[k] = v
    return out


def pair_frame(
    anchors: Sequence[Mapping[str, Any]], candidates: Sequence[Mapping[str, Any]]
) -> pd.DataFrame:
    """The pair frame of aligned anchor and candidate records (the models' input).

    Args:
        anchors: one kernel record per pair (the anchor).
        candidates: one kernel record per pair (the candidate), same length.
    Returns:
        Columns task, a_<field>, c_<field> for KERNEL_FIELDS and COMPILE_FIELDS.
    Raises:
        ValueError: lengths differ.
    """
    if len(anchors) != len(candidates):
        raise ValueError(f"{len(anchors)} anchors but {len(candidates)} candidates")
    rows = []
    for a, c in zip(anchors, candidates, strict=True):
        row: dict[str, Any] = {"task": c.get("task") or a.get("task")}
        for side, rec in (("a", a), ("c", c)):
            for f in KERNEL_FIELDS:
                row[f"{side}_{f}"] = rec.get(f)
            for f in COMPILE_FIELDS:
                row[f"{side}_{f}"] = _number(rec.get(f))
        rows.append(row)
    columns = ["task"] + [f"{s}_{f}" for s in SIDES for f in (*KERNEL_FIELDS, *COMPILE_FIELDS)]
    return pd.DataFrame(rows, columns=columns)


def side_records(frame: pd.DataFrame, side: str) -> list[dict[str, Any]]:
    """The kernel records of one side ('a' or 'c') of a pair frame, with the task."""
    prefix = f"{side}_"
    cols = [c for c in frame.columns if c.startswith(prefix)]
    part = frame[cols].rename(columns={c: c[len(prefix):] for c in cols})
    part = part.assign(task=frame["task"].to_numpy())
    return part.to_dict("records")


# kernel_features of the records this process has seen, by a digest of the record: a fit's
# calibration, its evaluation and the next split's fit read the same kernels again, and the
# source counts (some 35 regular expressions a kernel) were most of a fit's feature time.
_FEATURES: dict[Any, dict[str, Any]] = {}
_FEATURES_MAX = 100_000


_NAN = object()  # stands for a NaN in a record's key: NaN equals nothing, not even itself


def _record_key(record: Mapping[str, Any]) -> Any:
    """A dict key equal for records of equal fields and values (NaN equal to NaN).

    Why a tuple of the values, not a digest of their text: a record's strings (its source,
    thousands of characters) keep their hash once computed, so the key of a kernel seen before
    costs microseconds; a digest of its text cost ~130 us a record, some 2 s of a smoke run's
    forecasts. The value's type is part of the key, so 1 and 1.0 stay apart as their text does.
    """
    key = tuple((k, type(v), _NAN if isinstance(v, float) and v != v else v) for k, v in record.items())
    try:
        hash(key)
    except TypeError:  # an unhashable value (knobs given as a dict): its text
        return repr(sorted((k, repr(v)) for k, v in record.items()))
    return key


def _features_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kernel_features of each record, computed once per distinct record (an anchor recurs in
    thousands of pairs). The dicts are shared: callers read them, never change them."""
    out = []
    for r in records:
        key = _record_key(r)
        found = _FEATURES.get(key)
        if found is None:
            if len(_FEATURES) >= _FEATURES_MAX:
                _FEATURES.clear()
            found = _FEATURES[key] = kernel_features(r)
        out.append(found)
    return out


class FeatureSpace:
    """The columns a cost model was fitted on, so predictions see the same table.

    Numeric kernel features become float columns; string ones become pandas categoricals with
    the categories seen at fit time (an unseen value is missing, which the trees route like any
    missing value). Each pair gives the candidate's features (`c:`), the anchor's (`a:`), and
    the candidate-minus-anchor difference of every numeric feature (`d:`), so cross pairs
    (two Triton kernels) are read relative to each other.
    """

    def __init__(self) -> None:
        self.numeric: list[str] = []
        self.categorical: dict[str, list[str]] = {}
        self.columns: list[str] = []

    def fit(self, frame: pd.DataFrame) -> FeatureSpace:
        """Learn the columns of a pair frame's features; columns that never vary there (e.g.
        compile features no fitted kernel has) are left out."""
        feats = _features_of(side_records(frame, "c") + side_records(frame, "a"))
        numeric: set[str] = set()
        cats: dict[str, set[str]] = {"task": set(frame["task"].astype(str))}
        for f in feats:
            for k, v in f.items():
                if k.startswith(WORK_PREFIX):
                    continue  # read by the cost model's work prior (work_ratio), not by its trees
                if isinstance(v, str):
                    cats.setdefault(k, set()).add(v)
                else:
                    numeric.add(k)
        self.numeric = sorted(numeric - set(cats))
        self.categorical = {k: sorted(v) for k, v in sorted(cats.items())}
        table = self._table(frame)
        self.columns = [c for c in table.columns if table[c].nunique(dropna=True) >= 2]
        return self

    @classmethod
    def of_numeric_columns(cls, columns: Sequence[str]) -> FeatureSpace:
        """The space that gives these numeric columns ("c:k", "a:k", "d:k") of a fitted one,
        without its fit.

        Why: a numeric column's value depends only on the two records, never on the fit, so its
        name is all a fitted space needs to keep to compute it for a new pair (what the code
        LLM's bundle records of the space it used: its `feature_names`).

        Raises:
            ValueError: a name that is not a side-prefixed feature (one line).
        """
        bad = [c for c in columns if c.split(":", 1)[0] not in ("a", "c", "d") or ":" not in c]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a numeric column of a feature table (c:, a: or d: and a feature)")
        space = cls()
        space.numeric = sorted({c.split(":", 1)[1] for c in columns})
        space.columns = list(columns)
        return space

    def _side(self, feats: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
        cols: dict[str, Any] = {}
        for k in self.numeric:
            cols[f"{prefix}{k}"] = np.array([_number(f.get(k)) for f in feats], dtype=np.float64)
        for k, cats in self.categorical.items():
            if k == "task":
                continue
            known = set(cats)
            values = [f.get(k) if f.get(k) in known else None for f in feats]  # unseen: missing
            cols[f"{prefix}{k}"] = pd.Categorical(values, categories=cats)
        return cols

    def transform(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The model's feature table of a pair frame (the fitted columns, in order)."""
        return self._table(frame)[self.columns]

    def _table(self, frame: pd.DataFrame) -> pd.DataFrame:
        c = _features_of(side_records(frame, "c"))
        a = _features_of(side_records(frame, "a"))
        tasks = self.categorical.get("task", [])
        cols: dict[str, Any] = {"task": pd.Categorical([t if t in tasks else None for t in frame["task"].astype(str)],
                                                       categories=tasks)}
        cols.update(self._side(c, "c:"))
        cols.update(self._side(a, "a:"))
        for k in self.numeric:
            cols[f"d:{k}"] = cols[f"c:{k}"] - cols[f"a:{k}"]
        return pd.DataFrame(cols, index=frame.index)
