"""File formats that travel between machines: kernel batches in, measurement results out.

Both are Parquet (zstd). Only pyarrow is needed, so the GPU worker can use this module on a
bare host. The warehouse ingests result files written in RESULT_SCHEMA and refuses others. It
lives on the bottom floor, beside the kernel ids (warehouse/ids.py), so the worker that writes
these files and the ingest that reads them both import it downwards.
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa

HARNESS_VERSION = "kernelcast-harness-15"  # 2: launch cover, median of reference timings; 3: sandbox, verifier;
# 4: timed calls on new values with sampled outputs verified, one integrity baseline per child;
# 5: timed chunks that grow from 16 calls, the median's interval also met by an absolute 0.5 us,
# a 5 ms warm-up of at least 2 calls; 6: inputs drawn on the GPU (other values, same
# distributions), the timed loop unchanged; 7: a 2 ms warm-up (at least 2 calls), the verifier
# runs each reference once per input; 8: at least 3 timed calls a case and the median's interval
# within 1% (was 8 and 0.5%), closeness judged in one fused pass on the GPU (docs/results/harness.md:
# the side-by-side runs); 9: a call of 5 ms or more gets one warm-up call and is timed one
# synchronised call at a time, each held to the wall clock (no probe calls after its loop);
# 10: on a GPU one timed output of each input variant verified per case (one per case before);
# gpumode times the kernel's and the reference's calls by turns, Python's collector off while timing
# 11: gpumode's turns are one timed call long (ten before), each after one untimed call
# 12: the outputs kept for the verifier are copies of their values, without the autograd graph that
# kept every intermediate of a torch-module kernel's call alive (out of memory on 80 GB cards)
# 13: every timed, warm-up and probe call (the reference's too) runs on values no earlier call of the
# case had: the base values of a timed variant rolled along their first dimension and scaled by a
# factor drawn per call (the verifier rebuilds a kept call's input from its salt and draw), so no
# memo of earlier answers pays; nothing reachable from a call's frames leads to the timer or the feed
# 14: the host's time per call recorded beside the device time (launch-bound cases flagged, the
# speedup over the slower of the two kept as program_speedup; the label stays the device time:
# docs/protocols.md says why); an autotuned kernel is tuned on each benchmark case's inputs before
# its checks, on a quiet GPU, and the configs it chose are recorded
# 15: every kernel gets that tuning pass (not only sources that name autotune), every Autotuner is
# watched where it runs, and no tuning result is read from or written to Triton's disk cache (the
# compile children's stand-in timings had stored the first config of `cache_results` autotuners)

FAILURE_KINDS = (
    "compile_failed",  # the module does not import / Triton does not compile it
    "runtime_error",  # raised while running a case
    "incorrect",  # ran, but check_implementation said no on some case
    "timeout",  # its worker went past the time limit and was killed
    "crashed",  # its worker died (segfault, illegal memory access, abort)
    "infrastructure",  # our fault, not the kernel's (e.g. no GPU, reference failed)
    "tampered",  # it patched the harness, torch or the timer, or its claims failed the parent's audit
)

# A batch for the worker: one row per kernel. Extra columns are allowed and ignored by the worker.
BATCH_SCHEMA = pa.schema(
    [
        pa.field("kernel_id", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
    ]
)

# A kernel batch as `kernelcast generate` writes it: a superset of BATCH_SCHEMA that carries
# lineage, so the same file feeds the GPU worker and the warehouse's `kernels` table.
KERNEL_BATCH_SCHEMA = pa.schema(
    list(BATCH_SCHEMA)
    + [
        pa.field("language", pa.string()),  # "triton" | "pytorch"
        pa.field("generator", pa.string()),  # "reference" | "kernelcast-space" | "llm:<model>" | ...
        pa.field("generator_version", pa.string()),
        pa.field("algorithm", pa.string()),  # family id within the task, e.g. "online_single_pass"
        pa.field("knobs_json", pa.string()),  # JSON object of knob values, sorted keys
        pa.field("parent_kernel_id", pa.string()),  # null for seeds and references
        pa.field("mutation", pa.string()),  # e.g. "BLOCK_N:256->512", "algorithm:two_pass->online"
    ]
)

# A result: one row per (batch, kernel). Per-case lists are aligned with case_ids.
RESULT_SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.string(), nullable=False),  # one profiling run (uuid4 hex)
        pa.field("kernel_id", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # "ok" | "failed"
        pa.field("failure_kind", pa.string()),  # one of FAILURE_KINDS when failed
        pa.field("error", pa.string()),  # one line
        pa.field("case_ids", pa.list_(pa.string())),
        pa.field("kernel_median_ms", pa.list_(pa.float64())),
        pa.field("kernel_mean_ms", pa.list_(pa.float64())),
        pa.field("kernel_stderr_ms", pa.list_(pa.float64())),
        pa.field("kernel_reps", pa.list_(pa.int32())),
        pa.field("ref_median_ms", pa.list_(pa.float64())),
        pa.field("ref_mean_ms", pa.list_(pa.float64())),
        pa.field("ref_stderr_ms", pa.list_(pa.float64())),
        pa.field("ref_reps", pa.list_(pa.int32())),
        pa.field("case_speedups", pa.list_(pa.float64())),  # t_ref / t_kernel, medians
        pa.field("speedup", pa.float64()),  # geometric mean over cases; null unless status ok
        pa.field("needs_recheck", pa.bool_()),  # speedup > 10x: flagged for a re-measure
        pa.field("protocol", pa.string(), nullable=False),  # "kernelcast" | "paper" | "gpumode"
        pa.field("harness_version", pa.string(), nullable=False),
        pa.field("hardware_id", pa.string(), nullable=False),  # e.g. "nvidia-h200-sm90"
        pa.field("hardware_json", pa.string(), nullable=False),  # full fingerprint, JSON
        pa.field("measured_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("compile_s", pa.float64()),
        pa.field("check_s", pa.float64()),
        pa.field("time_s", pa.float64()),
        # sandbox layers the kernel ran under, comma-separated (jail.py names them); null: unknown
        pa.field("sandbox", pa.string()),
        # The host's time per call of each case (ms; kernelcast on a GPU, harness 14 on; null where
        # not taken), measured while the worker's compile children load the host: an upper bound.
        pa.field("kernel_host_ms", pa.list_(pa.float64())),
        pa.field("ref_host_ms", pa.list_(pa.float64())),
        # The speedup over the slower of device and host time per case: what a program whose host
        # does not keep ahead of the GPU sees. `speedup`, the label, is over device times.
        pa.field("program_speedup", pa.float64()),
        pa.field("launch_bound", pa.bool_()),  # some case's host time exceeds its device time
        pa.field("autotune_json", pa.string()),  # {case id: {autotuned kernel: chosen config}}
    ]
)


def hardware_id(device_name: str, capability: tuple[int, int] | None) -> str:
    """Partition key of a device type: 'NVIDIA H200', (9, 0) -> 'nvidia-h200-sm90'; CPU -> 'cpu'."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown"
    return f"{slug}-sm{capability[0]}{capability[1]}" if capability else slug


def measurement_id(batch_id: str, kernel_id: str) -> str:
    """Deterministic id of one result row, so re-ingesting a file adds nothing."""
    return hashlib.sha256(f"{batch_id}:{kernel_id}".encode()).hexdigest()[:24]
