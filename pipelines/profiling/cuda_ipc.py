"""The CUDA IPC self-test: one CUDA tensor shipped from another process as IPC handles
(ipc_handles.py: device memory handed to the verifier without leaving the GPU) and as a file
(shipping.py); both must arrive equal, and the times of each way are printed.

    python3 -m pipelines.profiling.cuda_ipc [MIB]   # on a GPU: one tensor from another process,
                                                    # as handles and as a file; prints the times
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time

import torch

from pipelines.profiling.ipc_handles import IpcUnavailable
from pipelines.profiling.shipping import read_output, write_handles, write_output


def _exporter(path_ipc: str, path_file: str, mib: int, conn) -> None:
    """The other side of `self_test`: a process that owns the tensor and ships it both ways."""
    t = torch.arange(mib * 2**18, device="cuda", dtype=torch.float32).mul_(0.5)
    torch.cuda.synchronize()
    timings = {}
    for name, fn, path in (("ipc", write_handles, path_ipc), ("file", write_output, path_file)):
        start = time.perf_counter()
        keep = fn(path, (t, torch.empty(0, 4, device="cuda"), {"n": 3}))  # an empty tensor has no memory to map
        torch.cuda.synchronize()
        timings[f"write_{name}_s"] = time.perf_counter() - start
        del keep
    conn.send(timings)
    conn.recv()  # keep the tensor alive until the reader is done


def self_test(mib: int = 256) -> dict:
    """Ship a `mib` MiB CUDA tensor (and an empty one) from another process as IPC handles and as
    a file; both must arrive equal. Returns the timings (seconds) of writing and reading each way."""
    with tempfile.TemporaryDirectory(prefix="kc-ipc-") as d:
        ipc, file = f"{d}/out-000001.kco", f"{d}/out-000002.kco"
        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe()
        p = ctx.Process(target=_exporter, args=(ipc, file, mib, there), daemon=True)
        p.start()
        there.close()  # ours closed: if the exporter dies, recv() ends instead of waiting forever
        try:
            report = dict(here.recv())
        except EOFError:
            p.join(10)
            raise RuntimeError(f"the exporting process died (exit code {p.exitcode})") from None
        want = torch.arange(mib * 2**18, device="cuda", dtype=torch.float32).mul_(0.5)
        for name, path in (("ipc", ipc), ("file", file)):
            start = time.perf_counter()
            got, empty, extra = read_output(path, "cuda")
            torch.cuda.synchronize()
            report[f"read_{name}_s"] = time.perf_counter() - start
            report[f"{name}_equal"] = bool(torch.equal(got, want)) and empty.shape == (0, 4) and extra == {"n": 3}
        here.send("done")
        p.join(10)
    return {"mib": mib, **report}


def main(argv: list[str] | None = None) -> int:
    from pipelines.profiling import cuda_ipc  # by name, so the spawned exporter finds its function

    ap = argparse.ArgumentParser(description="Ship one CUDA tensor from another process as IPC handles "
                                             "and as a file; print the times as JSON.")
    ap.add_argument("mib", nargs="?", type=int, default=256, help="tensor size, MiB (default 256)")
    args = ap.parse_args(argv)
    if args.mib < 1:
        ap.error("mib must be at least 1")
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here: CUDA IPC needs one", file=sys.stderr)
        return 2
    try:
        result = cuda_ipc.self_test(args.mib)
    except (RuntimeError, IpcUnavailable, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0 if result.get("ipc_equal") and result.get("file_equal") else 1


if __name__ == "__main__":
    sys.exit(main())
