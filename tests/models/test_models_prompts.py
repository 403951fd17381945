"""The prompt: every section in order, the pinned bin table, the diff style, never a runtime."""

import re

import pytest

from models.bins import BIN_NAMES, BIN_RANGES
from models.hardware import (
    capability_text,
    datasheet_bandwidth_gbps,
    hardware_fields,
    hardware_table,
)
from models.prompts import ANSWER_PREFIX, build_prompt, unified_diff, with_answer_prefix

ANCHOR = (
    "import triton\n\n@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n    x = tl.load(x_ptr)\n"
)
CANDIDATE = ANCHOR.replace("x = tl.load(x_ptr)", "x = tl.load(x_ptr, cache_modifier='.cg')")
H200 = {
    "name": "NVIDIA H200",
    "compute_capability": [9, 0],
    "sm_count": 132,
    "total_memory_bytes": 150_000_000_000,
    "l2_cache_bytes": 62_914_560,
    "nvidia_smi": {"clocks_max_sm": "1980", "clocks_max_mem": "3201"},
    # Things a fingerprint or row may carry that must never reach the prompt:
    "anchor_runtime_ms": 0.123456,
    "median_ms": 9.87654,
}


def prompt(style="full", hardware=H200):
    return build_prompt(
        "softmax", "Row-wise softmax of a 2-D tensor.", ANCHOR, CANDIDATE, hardware, style
    )


def test_sections_in_order():
    system, user = prompt()
    assert (system["role"], user["role"]) == ("system", "user")
    text = system["content"]
    markers = [
        "GPU execution simulator",
        "## Speedup",
        "## Bins",
        "## Probabilities",
        "## How to analyse",
        "## Output format",
    ]
    positions = [text.index(m) for m in markers]
    assert positions == sorted(positions)
    for topic in (
        "coalescing",
        "arithmetic intensity",
        "occupancy",
        "synchronisation",
        "launch overhead",
        "tensor cores",
    ):
        assert topic in text
    assert '"predicted_bin"' in text and '"p"' in text and '"reasoning"' in text
    assert "neighbouring bins" in text and "certainty" in text


def test_bin_table_comes_from_the_bins_module():
    text = prompt()[0]["content"]
    for i, (name, rng) in enumerate(zip(BIN_NAMES, BIN_RANGES)):
        assert f"| {i + 1} | {name} | {rng} |" in text


def test_user_message_holds_task_hardware_and_both_sources():
    user = prompt()[1]["content"]
    assert "## Task: softmax" in user and "Row-wise softmax" in user
    assert "| device | NVIDIA H200 |" in user and "| SM count | 132 |" in user
    assert ANCHOR.strip() in user and CANDIDATE.strip() in user
    assert user.index("## Anchor kernel") < user.index("## Candidate kernel")


def test_diff_style_has_anchor_and_diff_only():
    user = prompt("diff")[1]["content"]
    assert ANCHOR.strip() in user
    assert (
        "cache_modifier='.cg'" in user and "+    x = tl.load(x_ptr, cache_modifier='.cg')" in user
    )
    assert "-    x = tl.load(x_ptr)" in user
    assert user.count("import triton") == 1  # the candidate is not repeated in full
    assert unified_diff("a\n", "a\n") == "(no differences)\n"
    assert unified_diff("a", "b").endswith("+b\n")  # no newline at end of file stays line-separated


def test_never_a_runtime():
    for style in ("full", "diff"):
        text = "\n".join(m["content"] for m in prompt(style))
        assert "0.123456" not in text and "9.87654" not in text and "median_ms" not in text
        assert not re.search(r"\d\s*(ms|us|µs)\b", text)


def test_unknown_style_raises():
    with pytest.raises(ValueError, match="unknown prompt style"):
        prompt("short")


def test_answer_prefix_message():
    msgs = with_answer_prefix(prompt())
    assert msgs[-1] == {"role": "assistant", "content": ANSWER_PREFIX} and len(msgs) == 3


def test_hardware_table_from_fingerprint():
    rows = dict(hardware_fields(H200))
    assert rows["compute capability"] == "9.0 (sm_90)"
    assert rows["memory"] == "139.7 GiB"
    assert rows["memory bandwidth"] == "4.8 TB/s (datasheet)"
    assert rows["L2 cache"] == "60 MiB"
    assert rows["SM clock"] == "1980 MHz" and rows["memory clock"] == "3201 MHz"


def test_hardware_table_from_warehouse_row_and_unknowns():
    row = {
        "device_name": "Some GPU",
        "capability": "8.9",
        "sm_count": 10,
        "memory_gb": 24.0,
        "memory_bandwidth_gbps": 1000,
    }
    rows = dict(hardware_fields(row))
    assert (
        rows["memory bandwidth"] == "1 TB/s (reported)"
        and rows["compute capability"] == "8.9 (sm_89)"
    )
    assert hardware_table({}).splitlines()[2:] == [
        "| device | unknown |",
        "| memory bandwidth | unknown |",
    ]


@pytest.mark.parametrize(
    "name,gbps",
    [
        ("NVIDIA H200", 4800.0),
        ("NVIDIA H100 80GB HBM3", 3350.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100 80GB PCIe", 1935.0),
        ("NVIDIA A100-SXM4-40GB", 1555.0),
        ("NVIDIA L4", 300.0),
        ("NVIDIA L40S", 864.0),
        ("Tesla T4", 320.0),
        ("NVIDIA GH200 480GB", None),
        ("cpu", None),
    ],
)
def test_datasheet_bandwidths(name, gbps):
    assert datasheet_bandwidth_gbps(name) == gbps


def test_capability_spellings():
    assert (
        capability_text((9, 0))
        == capability_text("9.0")
        == capability_text("sm_90")
        == "9.0 (sm_90)"
    )
    assert capability_text("sm_100") == "10.0 (sm_100)"
