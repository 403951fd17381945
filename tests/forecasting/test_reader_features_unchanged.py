"""The file reader's features of a few kernels are what the trained forecasters were fitted on.

The cost model reads the features the reader computes (compile, trace, source features), so a
change that makes the reader faster must leave every value as it was. `reader_features.json`
holds the sources and the records the reader gave them before such changes (written by
`python tests/forecasting/test_reader_features_unchanged.py --write`, only when the features are
meant to change, which asks for the models to be fitted again); the test reads the same sources
again and compares every value exactly. The kernels: softmax templates of several families (the
torch_partial one in both of its fallbacks, half Triton, half PyTorch), the softmax and rms_norm
references, and the device-query fixtures (launchers that ask the stand-in device).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("reader_features.json")
HARDWARE = "nvidia-h200-sm90"


def _sources() -> list[dict[str, str]]:
    """The kernels of the golden file (name, task, source), as first written."""
    from pipelines.generation import registry
    from pipelines.generation.reference import reference_source

    out = []
    want = {("torch_partial", "normalise_in_torch"), ("torch_partial", "stats_in_torch"), ("row_in_registers", None),
            ("unfused_multi_kernel", None), ("grid_capped_online", None), ("online_two_pass", None)}
    for p in registry.iter_points("softmax"):
        key = (p.algorithm, p.knobs.get("fallback"))
        if key in want and registry.is_valid_point(p):
            want.discard(key)
            name = f"softmax-{p.algorithm}" + (f"-{key[1]}" if key[1] else "")
            out.append({"name": name, "task": "softmax", "source": registry.render_point(p)})
    out += [{"name": f"{t}-reference", "task": t, "source": reference_source(t)} for t in ("softmax", "rms_norm")]
    device_query = ROOT / "tests" / "fixtures_kernels" / "device_query"
    for f, task in (("driver_warmup_softmax.py", "softmax"), ("torch_props_rms_norm.py", "rms_norm"),
                    ("autotuned_layer_norm.py", "layer_norm"), ("moves_to_cuda_softmax.py", "softmax")):
        out.append({"name": f"device-query-{f}", "task": task, "source": (device_query / f).read_text()})
    return out


def _read(kernels: list[dict[str, str]]) -> dict[str, dict]:
    """name -> the reader's record (less its source) or refusal, every kernel read afresh."""
    from pipelines.forecasting.files import read_kernel_sources

    out: dict[str, dict] = {}
    for task in sorted({k["task"] for k in kernels}):
        mine = [k for k in kernels if k["task"] == task]
        files = read_kernel_sources(task, [k["source"] for k in mine], HARDWARE, names=[k["name"] for k in mine])
        for f in files:
            rec = {k: v for k, v in (f.record or {}).items() if k != "source"}
            out[f.name] = {"record": rec, "refused": f.refused, "notes": f.notes}
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.fixture(scope="module")
def golden_and_now():
    golden = json.loads(GOLDEN.read_text())
    return golden, _read(golden["kernels"])


def test_the_golden_file_covers_what_it_says(golden_and_now):
    golden, _ = golden_and_now
    names = {k["name"] for k in golden["kernels"]}
    assert {"softmax-torch_partial-normalise_in_torch", "softmax-torch_partial-stats_in_torch",
            "softmax-reference", "device-query-driver_warmup_softmax.py"} <= names
    for name, want in golden["read"].items():  # every kernel was read with compile features where Triton
        assert want["refused"] is None and want["notes"] == [], (name, want)
        if want["record"]["language"] == "triton":
            assert want["record"]["n_regs"], name


def test_every_feature_of_every_kernel_is_unchanged(golden_and_now):
    golden, now = golden_and_now
    diffs = []
    for name, want in golden["read"].items():
        got = now[name]
        if got["refused"] != want["refused"] or got["notes"] != want["notes"]:
            diffs.append(f"{name}: refused/notes {got['refused']!r} {got['notes']!r}")
        keys = set(want["record"]) | set(got["record"])
        diffs += [f"{name}: {k} was {want['record'].get(k)!r}, now {got['record'].get(k)!r}" for k in sorted(keys)
                  if not _same(want["record"].get(k), got["record"].get(k))]
    assert not diffs, "\n".join(diffs)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {Path(__file__).name} --write   (rewrites {GOLDEN.name} from this code)")
    sys.path.insert(0, str(ROOT))
    kernels = _sources()
    GOLDEN.write_text(json.dumps({"kernels": kernels, "read": _read(kernels)}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(kernels)} kernels)")
