"""Hand-written kernels of our own, in styles the template space does not have.

One plain module per kernel under handwritten/<task>/<name>.py, each defining custom_kernel(data)
for its task and two module-level string constants read here without importing the module:
    STYLE     the style, e.g. "pytorch_decomposed", "torch_compile", "triton_persistent";
              the batch generator is "handwritten:<STYLE>"
    LANGUAGE  "pytorch" or "triton"
torch.compile'd kernels compile lazily on their first call, so every module imports without a
GPU. Their records carry no algorithm or knobs: the code is all there is.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from warehouse.ids import kernel_record

GENERATOR_PREFIX = "handwritten"
GENERATOR_VERSION = "handwritten-1"
ROOT = Path(__file__).resolve().parent


def _constants(source: str) -> dict[str, str]:
    out = {}
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            out[node.targets[0].id] = node.value.value
    return out


def kernel_files(task: str | None = None) -> list[Path]:
    """The hand-written kernel modules (of one task, or all), in a fixed order."""
    tasks = [ROOT / task] if task else sorted(p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("_"))
    return [f for d in tasks for f in sorted(d.glob("*.py")) if not f.name.startswith("_")]


def record(path: Path) -> dict[str, Any]:
    """KERNEL_BATCH_SCHEMA row of one hand-written module.

    Raises:
        ValueError: the module lacks STYLE/LANGUAGE or custom_kernel.
    """
    source = path.read_text()
    consts = _constants(source)
    if "STYLE" not in consts or consts.get("LANGUAGE") not in ("pytorch", "triton"):
        raise ValueError(f"{path}: needs STYLE = '...' and LANGUAGE = 'pytorch' | 'triton'")
    if "def custom_kernel(" not in source:
        raise ValueError(f"{path}: defines no custom_kernel(data)")
    return kernel_record(source, path.parent.name, consts["LANGUAGE"], f"{GENERATOR_PREFIX}:{consts['STYLE']}",
                         GENERATOR_VERSION)


def records(task: str | None = None) -> list[dict[str, Any]]:
    """Rows of every hand-written kernel (of one task, or all)."""
    return [record(p) for p in kernel_files(task)]
