"""Compile features of a batch of kernels, as a command (AOT for sm_90, no GPU needed).

    python3 -m pipelines.generation.compile_batch --kernels K.parquet --out F.parquet [--workers 15]

K holds kernel records (kernel_id, task, source, language); F gets one row per kernel in the
format `warehouse.kernels.ingest_compile_features` reads (kernel_id, target, status, n_regs,
n_spills, shared_bytes, n_kernels, n_launches, error, seconds). Rows are written every
`--chunk` kernels, so a run cut short keeps what it compiled, and a rerun with the same --out
compiles only the kernels still missing. Needs only the standard library, pyarrow and what
pipelines.generation.aot needs (torch, triton): it runs on a bare GPU host.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.generation.aot import compile_many

SCHEMA = pa.schema([("kernel_id", pa.string()), ("target", pa.string()), ("status", pa.string()),
                    ("n_regs", pa.int64()), ("n_spills", pa.int64()), ("shared_bytes", pa.int64()),
                    ("n_kernels", pa.int64()), ("n_launches", pa.int64()), ("error", pa.string()),
                    ("seconds", pa.float64())])


def compile_records(records: list[dict], out: Path, workers: int, chunk: int = 400, target: str = "sm_90",
                    log=print) -> int:
    """Compile features of `records` into `out` (Parquet), skipping kernels already there."""
    done: list[dict] = pq.read_table(out).to_pylist() if out.is_file() else []
    seen = {r["kernel_id"] for r in done}
    todo = [r for r in records if r["kernel_id"] not in seen]
    log(f"{len(todo)} kernels to compile ({len(seen)} already in {out})")
    capability = int(target.removeprefix("sm_"))
    t0 = time.time()
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        feats = compile_many(part, n_workers=workers, target=(capability, 32))
        done += [{"kernel_id": r["kernel_id"], "target": target, "status": f.status, "n_regs": f.n_regs,
                  "n_spills": f.n_spills, "shared_bytes": f.shared_bytes, "n_kernels": f.n_kernels,
                  "n_launches": f.n_launches, "error": f.error, "seconds": round(f.seconds, 3)}
                 for r, f in zip(part, feats, strict=True)]
        tmp = out.with_name(out.name + ".part")
        pq.write_table(pa.Table.from_pylist(done, schema=SCHEMA), tmp, compression="zstd")
        tmp.replace(out)
        log(f"{min(start + chunk, len(todo))}/{len(todo)} compiled, {time.time() - t0:.0f} s")
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.generation.compile_batch", description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", required=True, help="Parquet of kernel records (kernel_id, task, source, language)")
    parser.add_argument("--out", required=True, help="features Parquet (appended to across runs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=400)
    parser.add_argument("--target", default="sm_90")
    args = parser.parse_args(argv)
    try:
        records = pq.read_table(args.kernels, columns=["kernel_id", "task", "source", "language"]).to_pylist()
    except (OSError, pa.ArrowInvalid, KeyError) as e:
        print(f"error: {args.kernels}: {e}", file=sys.stderr)
        return 2
    compile_records(records, Path(args.out), args.workers, args.chunk, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
