"""Time the embedded base model's two CPU costs side by side: converting the SmolLM2 GGUF
(transformers parsing the file for each use, against once), and vLLM's offline engine reading
four compact prompts in each given dtype ("auto" is what a user gets):

    python3 benchmarks/base_model_cpu.py [--vllm-python .vllm-venv/bin/python] [--dtypes auto bfloat16 float32]

Prints seconds per step. Conversions go into a temporary folder; the second one's files are
compared with the first's.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import tempfile
import time
from pathlib import Path


def convert_both(work: Path) -> Path:
    """Convert twice, parsing the GGUF per use and then once; the second checkpoint."""
    from models import base_model

    parse_once = base_model.gguf_parsed_once
    for label, ctx in (("each use parses the GGUF", contextlib.nullcontext), ("parsed once", parse_once)):
        base_model.gguf_parsed_once = ctx
        t0 = time.perf_counter()
        base_model.convert_smollm2_gguf(work / label.replace(" ", "-"))
        print(f"conversion, {label}: {time.perf_counter() - t0:.1f} s", flush=True)
    base_model.gguf_parsed_once = parse_once
    a, b = work / "each-use-parses-the-GGUF", work / "parsed-once"
    same = all(filecmp.cmp(a / n, b / n, shallow=False) for n in ("model.safetensors", "tokenizer.json", "config.json"))
    print(f"same weights, tokenizer and config: {same}", flush=True)
    return b


def time_vllm(model: Path, python: str, dtypes: list[str]) -> None:
    from models.backends import ForecastRequest
    from models.backends.vllm_backend import VLLMEngine, VLLMOfflineAnswerer
    from models.prompts import build_prompt
    from pipelines.generation.candidates import build_candidates

    sources = build_candidates("softmax", 4, seed=0, compile=False)["source"].to_list()
    hardware = {"name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}
    requests = [ForecastRequest(build_prompt("softmax", "Row softmax of a matrix.", sources[0], s, hardware, "compact"),
                                f"p{i}") for i, s in enumerate(sources[1:])]
    for dtype in dtypes:
        engine = VLLMEngine(model, python=python, dtype=dtype)
        forecaster = VLLMOfflineAnswerer(model, engine=engine)
        try:
            t0 = time.perf_counter()
            engine.start()
            t1 = time.perf_counter()
            forecaster.forecast(requests)
            t2 = time.perf_counter()
        finally:
            engine.close()
        print(f"vLLM dtype {dtype} (ran as {engine.info.get('dtype', '?')}): start {t1 - t0:.1f} s, "
              f"{len(requests)} prompts {t2 - t1:.1f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(Path(__file__).resolve().parents[1] / ".vllm-venv" / "bin" / "python"))
    ap.add_argument("--dtypes", nargs="*", default=["auto", "bfloat16", "float32"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kc-bench-") as tmp:
        model = convert_both(Path(tmp))
        if args.dtypes and not Path(args.vllm_python).is_file():
            print(f"vLLM not timed: no python at {args.vllm_python} (`make vllm-venv`, or --vllm-python)")
        elif args.dtypes:
            time_vllm(model, args.vllm_python, args.dtypes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
