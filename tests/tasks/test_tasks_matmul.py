"""Task contracts of matmul_bias_gelu, causal_attention and gdn_chunk_fwd_o (CPU, PyTorch only)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from pipelines.tasks import get_task

TASKS = ("matmul_bias_gelu", "causal_attention", "gdn_chunk_fwd_o")
CASES = [(name, i) for name in TASKS for i in range(len(get_task(name).correctness_cases))]


def _tensors(data) -> list[torch.Tensor]:
    return [x for x in data if isinstance(x, torch.Tensor)]


@pytest.mark.parametrize(("name", "index"), CASES)
def test_reference_passes_its_own_check_and_keeps_inputs(name: str, index: int) -> None:
    task = get_task(name)
    data = task.generate_input(**task.correctness_cases[index])
    before = [t.clone() for t in _tensors(data)]
    out = task.ref_kernel(data)
    assert out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all()
    assert task.check_implementation(data, out) == (True, "ok")
    for old, new in zip(before, _tensors(data), strict=True):
        assert torch.equal(old, new), "ref_kernel modified its input"


@pytest.mark.parametrize("name", TASKS)
def test_inputs_are_deterministic_by_seed(name: str) -> None:
    task = get_task(name)
    case = dict(task.correctness_cases[0])
    first, again = task.generate_input(**case), task.generate_input(**case)
    for a, b in zip(_tensors(first), _tensors(again), strict=True):
        assert torch.equal(a, b)
    case["seed"] += 1
    other = task.generate_input(**case)
    assert not torch.equal(_tensors(first)[0], _tensors(other)[0])


@pytest.mark.parametrize("name", TASKS)
def test_wrong_outputs_fail_with_a_message(name: str) -> None:
    task = get_task(name)
    data = task.generate_input(**task.correctness_cases[0])
    ref = task.ref_kernel(data)
    ok, msg = task.check_implementation(data, ref + 0.25)
    assert not ok and "elements off" in msg
    ok, msg = task.check_implementation(data, ref.float())
    assert not ok and "dtype" in msg
    ok, msg = task.check_implementation(data, ref[..., :-1])
    assert not ok and "shape" in msg


@pytest.mark.parametrize("name", TASKS)
def test_cases_match_the_input_signature(name: str) -> None:
    task = get_task(name)
    assert task.name == name
    assert len(task.description) > 200
    assert 2 <= len(task.correctness_cases) <= 3
    assert 3 <= len(task.benchmark_cases) <= 5
    assert task.tolerances["rtol"] > 0 and task.tolerances["atol"] > 0
    sig = inspect.signature(task.generate_input)
    for case in task.correctness_cases + task.benchmark_cases:
        assert "seed" in case
        sig.bind(**case)  # raises if a case names an unknown size
    ids = [task.case_id(c) for c in task.benchmark_cases]
    assert len(set(ids)) == len(ids)


def test_ragged_sizes_are_covered() -> None:
    mm = get_task("matmul_bias_gelu").correctness_cases
    assert any(c["M"] % 16 and c["N"] % 16 and c["K"] % 16 for c in mm)
    att = get_task("causal_attention").correctness_cases
    assert any(c["S"] % 16 for c in att)
    gdn = get_task("gdn_chunk_fwd_o").correctness_cases
    assert any(c["T"] % 64 for c in gdn) and any(c["T"] > 64 for c in gdn)


def test_matmul_reference_is_gelu_of_affine_map() -> None:
    task = get_task("matmul_bias_gelu")
    a, b, bias = task.generate_input(**task.correctness_cases[0])
    x = a.float() @ b.float() + bias.float()
    expected = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    assert torch.allclose(task.ref_kernel((a, b, bias)).float(), expected, rtol=2e-2, atol=2e-2)


def test_attention_reference_matches_sdpa() -> None:
    task = get_task("causal_attention")
    q, k, v = task.generate_input(**task.correctness_cases[0])
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True
    )
    assert task.check_implementation((q, k, v), sdpa.to(torch.bfloat16)) == (True, "ok")
    # the first query sees only the first key
    assert torch.allclose(task.ref_kernel((q, k, v))[:, :, 0].float(), v[:, :, 0].float())


def _gdn_token_by_token(q, k, v, h, g, scale, intra: bool = True) -> torch.Tensor:
    """The slow definition: every token against its chunk state and earlier tokens of its chunk."""
    B, T, H, _ = q.shape
    out = torch.zeros(B, T, H, v.shape[-1])
    for b in range(B):
        for hd in range(H):
            for i in range(T):
                n, start = i // 64, (i // 64) * 64
                qi = q[b, i, hd].double() * scale
                o = math.exp(g[b, i, hd]) * (qi @ h[b, n, hd].double())
                for j in range(start, i + 1 if intra else start):
                    decay = math.exp(g[b, i, hd] - g[b, j, hd])
                    o = o + (qi @ k[b, j, hd].double()) * decay * v[b, j, hd].double()
                out[b, i, hd] = o.float()
    return out


@pytest.mark.parametrize("index", [0, 2])
def test_gdn_chunked_reference_matches_token_by_token(index: int) -> None:
    task = get_task("gdn_chunk_fwd_o")
    data = task.generate_input(**task.correctness_cases[index])
    slow = _gdn_token_by_token(*data)
    fast = task.ref_kernel(data).float()
    assert torch.allclose(fast, slow, rtol=1e-2, atol=1e-2)
    # a kernel that forgets the intra-chunk term must fail the check
    inter_only = _gdn_token_by_token(*data, intra=False).to(torch.bfloat16)
    assert not task.check_implementation(data, inter_only)[0]


def test_gdn_gates_are_cumulative_within_chunks() -> None:
    task = get_task("gdn_chunk_fwd_o")
    case = task.correctness_cases[0]
    _, _, _, h, g, scale = task.generate_input(**case)
    assert h.shape[1] == math.ceil(case["T"] / 64)
    assert scale == pytest.approx(case["K"] ** -0.5)
    assert g.dtype == torch.float32 and (g <= 0).all()
    steps = g[:, 1:] - g[:, :-1]
    inside = torch.arange(1, case["T"]) % 64 != 0  # token t and t-1 share a chunk
    assert (steps[:, inside] <= 0).all()  # log-gates only decrease inside a chunk
    assert (g[:, 64] > g[:, 63]).all()  # resets at the chunk boundary
