"""An HF causal LM in process as a PromptAnswerer: logprob or verbalized readout, batched.

- logprob: the prompt (chat template, generation prompt) plus `ANSWER_PREFIX`, one forward
  pass per batch, the next-token probabilities of the labels "1".."8" renormalised over the
  eight (method.md section 2). Cheap: no generation, deterministic, every repeat identical.
- verbalized: batched `generate` with left padding, then `parse_forecast` on the decoded
  completion. Optional retries of parse failures (they only help when sampling).

Batches are left-padded and position ids are derived from the attention mask, so a prompt
gets the same answer whatever else shares its batch (tested).

Tokenizers load with PreTrainedTokenizerFast, not AutoTokenizer: with some configs
AutoTokenizer picks a tokenizer class that rebuilds a different vocabulary.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models.backends import Messages, PromptAnswerer
from models.forecast import LOGPROB, VERBALIZED, Forecast
from models.parsing import parse_forecast
from models.prompts import ANSWER_PREFIX, BIN_LABELS

log = logging.getLogger(__name__)


def load_model_and_tokenizer(path: str | Path, device: str | None = None, dtype: str | None = None):
    """Load a saved causal LM and its tokenizer from a local directory.

    Args:
        path: a directory written by save_pretrained (config, weights, tokenizer files).
        device: "cpu", "cuda", ...; None picks cuda when available.
        dtype: "float32", "bfloat16", ...; None keeps the checkpoint's dtype.
    Returns:
        (model in eval mode, PreTrainedTokenizerFast).
    """
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype) if dtype else "auto"}
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs).to(device).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    return model, tokenizer


def checkpoint_ref(path: str | Path) -> str:
    """A cache name for a checkpoint directory: its path plus a digest of its files' sizes
    and modification times, so weights saved again into the same directory get new keys.
    """
    root = Path(path).resolve()
    stats = sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir() if p.is_file()
    )
    digest = hashlib.sha256(repr(stats).encode()).hexdigest()[:12]
    return f"{root}@{digest}"


def eos_token_ids(tokenizer: Any, generation_eos: Any = None) -> list[int]:
    """Stop tokens: the tokenizer's eos plus the generation config's (an int or a list).

    >>> class Tok: eos_token_id = 2
    >>> eos_token_ids(Tok(), [7, 2])
    [2, 7]
    """
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, generation_eos):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)


def render_chat(tokenizer: Any, messages: Messages) -> str:
    """The prompt text: chat template with the assistant generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of token sequences.

    >>> _common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]])
    2
    """
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def label_split(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """Token ids to feed, and the token id of each bin label that would come next.

    The labels are appended to the text before tokenizing, so tokenizers that merge a
    trailing space into the digit (" 3") and those that keep them apart ("Ġ", "3") both
    work: the shared prefix is fed, and the first token after it names the bin.

    Args:
        tokenizer: an HF tokenizer.
        text: the rendered prompt ending with the answer prefix.
    Returns:
        (prompt ids, eight label ids).
    Raises:
        ValueError: a label is not exactly one token after the shared prefix, or two labels
            share a token (the readout would be meaningless).
    """
    encoded = tokenizer([text + label for label in BIN_LABELS], add_special_tokens=False)[
        "input_ids"
    ]
    n = _common_prefix_len(encoded)
    if any(len(ids) != n + 1 for ids in encoded):
        raise ValueError(
            "bin labels 1..8 are not single tokens after the answer prefix for this tokenizer"
        )
    labels = [ids[n] for ids in encoded]
    if len(set(labels)) != len(labels):
        raise ValueError("two bin labels map to the same token")
    return list(encoded[0][:n]), labels


def left_pad(
    rows: list[list[int]], pad_id: int, device: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (batch, max_len), left-padded."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    # Positions count real tokens only, so padding never shifts a prompt's rotary positions.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


class TransformersAnswerer(PromptAnswerer):
    """Forecast with an HF causal LM in this process.

    Args:
        model: a local checkpoint directory, or a loaded PreTrainedModel.
        tokenizer: the tokenizer (or its directory); None loads it from `model`'s directory.
        readout: "logprob" (default; cheap) or "verbalized" (the paper's).
        max_new_tokens: generation budget of the verbalized readout.
        temperature: 0 = greedy; > 0 samples (repeats then differ).
        top_p: nucleus sampling mass when sampling.
        batch_size: prompts per forward pass / generate call.
        device: for a path: "cpu", "cuda" (None: cuda when available); a model object stays
            where it is unless a device is given.
        retries: extra attempts for a verbalized answer that fails to parse (sampling only).
        cache: optional ForecastCache.
        model_ref: names the model in cache keys; default for a path: the path plus a digest
            of its files' sizes and mtimes; required with a cache and a model object (weights
            in memory have no stable name).
        seed: base seed of sampling (per generate call: seed + call index).
        dtype: for a path: "float32", "bfloat16"; None keeps the checkpoint's.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        readout: str = LOGPROB,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_size: int = 8,
        device: str | None = None,
        retries: int = 0,
        cache: Any = None,
        model_ref: str | None = None,
        seed: int = 0,
        dtype: str | None = None,
    ) -> None:
        if readout not in (LOGPROB, VERBALIZED):
            raise ValueError(f"readout must be 'logprob' or 'verbalized', got {readout!r}")
        if isinstance(model, (str, Path)):
            self.model, loaded_tok = load_model_and_tokenizer(model, device, dtype)
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
            model_ref = model_ref or checkpoint_ref(model)
        else:
            self.model = model.eval() if device is None else model.to(device).eval()
            if tokenizer is None:
                raise ValueError("a tokenizer is required with a model object")
            if model_ref is None and cache is not None:
                raise ValueError("model_ref is required to cache forecasts of an in-memory model")
            model_ref = (
                model_ref
                or f"object:{getattr(model.config, '_name_or_path', '') or type(model).__name__}"
            )
        if isinstance(tokenizer, (str, Path)):
            from transformers import PreTrainedTokenizerFast

            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer))
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; the prompt is a chat")
        self.tokenizer = tokenizer
        self.readout = readout
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.batch_size = max(1, int(batch_size))
        self.progress_chunk = self.batch_size
        self.retries = int(retries)
        if self.retries and self.temperature == 0 and readout == VERBALIZED:
            log.warning("retries=%d ignored: greedy decoding repeats the same answer", self.retries)
        self.cache = cache
        self.model_ref = model_ref
        self.seed = int(seed)
        self._calls = 0
        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()

    # --- settings -------------------------------------------------------------------------

    def cache_params(self) -> dict[str, Any]:
        if self.readout == LOGPROB:
            return {"answer_prefix": ANSWER_PREFIX}
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p if self.temperature > 0 else 1.0,
            "retries": self.retries,
            "seed": self.seed if self.temperature > 0 else None,
        }

    def is_deterministic(self) -> bool:
        return self.readout == LOGPROB or self.temperature == 0

    def _pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0):
            if candidate is not None:
                return int(candidate)
        return 0

    def _eos_ids(self) -> list[int]:
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return eos_token_ids(self.tokenizer, gen_eos)

    def render(self, messages: Messages) -> str:
        """The prompt text: chat template with the assistant generation prompt."""
        return render_chat(self.tokenizer, messages)

    # --- running --------------------------------------------------------------------------

    def _run(self, items: list[tuple[Messages, int]]) -> list[Forecast | BaseException]:
        run = self._logprob_batch if self.readout == LOGPROB else self._verbalized_batch
        out: list[Forecast | BaseException] = []
        for start in range(0, len(items), self.batch_size):
            out.extend(run([messages for messages, _ in items[start : start + self.batch_size]]))
        if self.readout == VERBALIZED and self.retries and self.temperature > 0:
            out = self._retry_failures(items, out)
        return out

    @torch.inference_mode()
    def _logprob_batch(self, batch: list[Messages]) -> list[Forecast]:
        """One forward pass: label probabilities at the position after the answer prefix."""
        t0 = time.perf_counter()
        split = [label_split(self.tokenizer, self.render(m) + ANSWER_PREFIX) for m in batch]
        ids, mask, positions = left_pad([s[0] for s in split], self.pad_id, self.model.device)
        logits = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=1,
        ).logits[:, -1, :]  # (batch, vocab)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        label_ids = torch.tensor([s[1] for s in split], device=logprobs.device)  # (batch, 8)
        picked = logprobs.gather(1, label_ids).cpu().tolist()  # (batch, 8)
        latency = (time.perf_counter() - t0) / len(batch)
        return [
            Forecast.from_label_logprobs(row).with_meta(
                tokens=0, prompt_tokens=len(s[0]), latency_s=latency
            )
            for row, s in zip(picked, split, strict=True)
        ]

    @torch.inference_mode()
    def _verbalized_batch(self, batch: list[Messages]) -> list[Forecast]:
        """One generate call; each completion is parsed (failures recorded, never raised)."""
        t0 = time.perf_counter()
        prompts = [
            self.tokenizer(self.render(m), add_special_tokens=False)["input_ids"] for m in batch
        ]
        ids, mask, _ = left_pad(prompts, self.pad_id, self.model.device)
        sampling = self.temperature > 0
        kwargs: dict[str, Any] = {"do_sample": sampling}
        if sampling:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=0)
            torch.manual_seed(self.seed + self._calls)
        self._calls += 1
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=self.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids or None,
            **kwargs,
        )
        new = out[:, ids.shape[1] :].cpu().tolist()  # (batch, generated), eos/pad after the end
        latency = (time.perf_counter() - t0) / len(batch)
        forecasts = []
        for prompt, row in zip(prompts, new, strict=True):
            n = next((i + 1 for i, tok in enumerate(row) if tok in self.eos_ids), len(row))
            text = self.tokenizer.decode(row[:n], skip_special_tokens=True)
            forecasts.append(
                parse_forecast(text).with_meta(
                    tokens=n, prompt_tokens=len(prompt), latency_s=latency
                )
            )
        return forecasts

    def _retry_failures(
        self, items: list[tuple[Messages, int]], answers: list[Forecast | BaseException]
    ) -> list[Forecast | BaseException]:
        """Re-sample parse failures up to `retries` times; tokens and latency accumulate."""
        answers = list(answers)
        for _ in range(self.retries):
            failed = [
                i for i, a in enumerate(answers) if isinstance(a, Forecast) and not a.parse_ok
            ]
            if not failed:
                break
            for start in range(0, len(failed), self.batch_size):
                idx = failed[start : start + self.batch_size]
                for i, again in zip(
                    idx, self._verbalized_batch([items[i][0] for i in idx]), strict=True
                ):
                    before = answers[i]
                    assert isinstance(before, Forecast)
                    answers[i] = again.retry_of(before)
        return answers
