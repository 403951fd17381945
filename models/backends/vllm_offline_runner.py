"""Child process of `VLLMOfflineAnswerer`: one `vllm.LLM` engine, batches in, results out.

Runs under the python of the vLLM venv and imports only the standard library and vllm (never
`models.*`: the project's own packages are not installed there). It is started as a script,
with -P so that this file's folder stays off the import path (it could shadow installed packages),

    <vllm python> -P models/backends/vllm_offline_runner.py --model DIR [--engine-args JSON]

loads `vllm.LLM(model=DIR, enforce_eager=True, **engine_args)` once (on a CPU without bfloat16
instructions, dtype "auto" becomes float32), then speaks JSON lines:

- stdout (a private copy of fd 1; fd 1 itself is pointed at stderr before vllm is imported,
  so vLLM's logging, tqdm and the engine-core child never write into the protocol):
  `{"event": "ready", "vllm": "0.32.0", "load_s": 71.2, "dtype": "float32"}` once the engine is up, then per batch
  one `{"event": "result", ...}` line per request (in chunks of `chunk` requests, so a crash
  or a timeout mid-batch still leaves the finished ones with the parent) and
  `{"event": "done", "batch": N}`; `{"event": "error", "message": "..."}` when a batch failed.
- stdin: one JSON line per batch, `{"batch": N, "chunk": 8, "requests": [...]}`; EOF ends it.

A request is `{"index": i, "sampling": {...}}` plus exactly one prompt:
`"prompt_token_ids": [...]` (the parent rendered and tokenized it), `"prompt": "text"`, or
`"messages": [...]` (chat, rendered by vLLM; `"chat": {"add_generation_prompt": true,
"continue_final_message": false}`). `sampling` holds SamplingParams fields (temperature,
top_p, top_k, max_tokens, n, seed, logprobs, logprob_token_ids, stop_token_ids) plus
`"structured_outputs"`, a dict of `StructuredOutputsParams` fields (e.g. {"json": schema,
"disable_any_whitespace": true}), the vLLM >= 0.12 replacement of guided_json.

A result is `{"index": i, "prompt_tokens": n, "outputs": [{"text", "token_ids",
"finish_reason", "logprobs": [{"<token id>": logprob, ...} per generated position] or
null}]}`; a request vLLM rejected gets `{"index": i, "error": "one line"}` instead, and the
rest of its batch still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "max_tokens", "n", "seed", "logprobs",
    "logprob_token_ids", "stop_token_ids", "min_tokens",
)  # fmt: skip


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes in bfloat16 natively (x86 AVX512-BF16 or AMX, Arm's bf16);
    False where the flags cannot be read."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            flags = {w for line in f if line.startswith(("flags", "Features")) for w in line.partition(":")[2].split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


class Runner:
    """The loaded engine and the protocol stream."""

    def __init__(self, model: str, engine_args: dict, out) -> None:
        import vllm
        from vllm.platforms import current_platform

        kwargs = {"enforce_eager": True, **engine_args}
        if current_platform.is_cpu():
            # This runner is already the engine's own process: on a CPU host the engine core and
            # its worker run in it, instead of in two more processes that each import vllm again
            # (on 2 cores: ready in ~11 s instead of ~23 s, closed in ~3 s instead of ~8 s, and
            # batches ~25% faster). The environment may still ask for them.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            if kwargs.get("dtype", "auto") == "auto" and not cpu_has_bf16():
                # vLLM's "auto" turns a float32 checkpoint into bfloat16, which a CPU without
                # bf16 instructions emulates: four compact prompts took 66.9 s on an AVX2-only
                # host against 13.5 s in float32 (benchmarks/base_model_cpu.py).
                kwargs["dtype"] = "float32"
        self.vllm = vllm
        self.out = out
        t0 = time.perf_counter()
        self.llm = vllm.LLM(model=model, **kwargs)
        self.emit(event="ready", vllm=vllm.__version__, load_s=round(time.perf_counter() - t0, 2),
                  dtype=str(self.llm.llm_engine.model_config.dtype).removeprefix("torch."))

    def emit(self, **payload) -> None:
        self.out.write(json.dumps(payload) + "\n")
        self.out.flush()

    def sampling_params(self, spec: dict):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        kwargs = {k: spec[k] for k in SAMPLING_FIELDS if spec.get(k) is not None}
        if spec.get("structured_outputs"):
            kwargs["structured_outputs"] = StructuredOutputsParams(**spec["structured_outputs"])
        return SamplingParams(**kwargs)

    def result(self, index: int, output) -> dict:
        outputs = []
        for completion in output.outputs:
            positions = None
            if completion.logprobs is not None:
                positions = [
                    {str(tok): float(lp.logprob) for tok, lp in step.items()}
                    for step in completion.logprobs
                ]
            outputs.append(
                {
                    "text": completion.text,
                    "token_ids": list(completion.token_ids),
                    "finish_reason": completion.finish_reason,
                    "logprobs": positions,
                }
            )
        prompt_ids = output.prompt_token_ids
        return {
            "event": "result",
            "index": index,
            "prompt_tokens": None if prompt_ids is None else len(prompt_ids),
            "outputs": outputs,
        }

    def run_group(self, requests: list[dict]) -> list[dict]:
        """One vLLM call for requests of one prompt kind (and chat flags)."""
        params = [self.sampling_params(r.get("sampling") or {}) for r in requests]
        first = requests[0]
        if "messages" in first:
            chat = first.get("chat") or {}
            outputs = self.llm.chat(
                [r["messages"] for r in requests],
                params,
                use_tqdm=False,
                add_generation_prompt=chat.get("add_generation_prompt", True),
                continue_final_message=chat.get("continue_final_message", False),
            )
        else:
            prompts = [
                {"prompt_token_ids": r["prompt_token_ids"]}
                if "prompt_token_ids" in r
                else {"prompt": r["prompt"]}
                for r in requests
            ]
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [self.result(r["index"], o) for r, o in zip(requests, outputs, strict=True)]

    def run_chunk(self, requests: list[dict]) -> None:
        groups: dict[str, list[dict]] = {}
        for r in requests:
            kind = "messages" if "messages" in r else "tokens"
            key = kind + json.dumps(r.get("chat") or {}, sort_keys=True)
            groups.setdefault(key, []).append(r)
        for group in groups.values():
            try:
                results = self.run_group(group)
            except Exception as exc:  # noqa: BLE001 - a rejected request must not end the batch
                if len(group) == 1:
                    self.emit(event="result", index=group[0]["index"], error=_one_line(exc))
                    continue
                for r in group:  # find the culprit: one at a time
                    self.run_chunk([r])
                continue
            for item in results:
                self.emit(**item)

    def serve(self, stream) -> None:
        for line in stream:
            if not line.strip():
                continue
            try:
                batch = json.loads(line)
                requests = batch["requests"]
                chunk = max(1, int(batch.get("chunk") or len(requests) or 1))
                for start in range(0, len(requests), chunk):
                    self.run_chunk(requests[start : start + chunk])
                self.emit(event="done", batch=batch.get("batch"))
            except Exception as exc:  # noqa: BLE001 - report, keep serving
                traceback.print_exc(file=sys.stderr)
                self.emit(event="error", message=_one_line(exc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local checkpoint directory")
    parser.add_argument("--engine-args", default="{}", help="JSON dict of vllm.LLM arguments")
    args = parser.parse_args(argv)

    # The protocol gets a private copy of stdout; fd 1 becomes stderr for everything else
    # (vLLM logs, tqdm, the engine-core child process inherits fd 1 too).
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        runner = Runner(args.model, json.loads(args.engine_args), out)
    except Exception as exc:  # noqa: BLE001 - the parent wants one line, the log keeps the rest
        traceback.print_exc(file=sys.stderr)
        out.write(json.dumps({"event": "error", "message": _one_line(exc)}) + "\n")
        out.flush()
        return 1
    runner.serve(sys.stdin)
    return 0


if __name__ == "__main__":  # vLLM may spawn workers that re-import __main__: keep the guard
    sys.exit(main())
