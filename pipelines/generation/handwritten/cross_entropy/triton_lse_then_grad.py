"""cross_entropy in two Triton launches: one program per row streams the vocabulary once for an
online logsumexp and writes the loss; a 2-D grid of (row, vocabulary block) programs then writes
the gradient exp(x - lse) - onehot, so the long rows are spread over many programs."""

import torch
import triton
import triton.language as tl

STYLE = "triton_two_kernel"
LANGUAGE = "triton"


@triton.jit
def _lse_loss(x_ptr, t_ptr, lse_ptr, loss_ptr, V, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * stride
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        s = s * alpha + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(s * tl.where(m == float("-inf"), 0.0, tl.exp(m - row_max)), axis=0)
    lse = row_max + tl.log(total)
    target = tl.load(t_ptr + row)
    x_t = tl.load(base + target).to(tl.float32)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, lse - x_t)


@triton.jit
def _grad(x_ptr, t_ptr, lse_ptr, g_ptr, V, stride_x, stride_g, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    p = tl.exp(x - tl.load(lse_ptr + row))
    p = tl.where(cols == tl.load(t_ptr + row), p - 1.0, p)
    tl.store(g_ptr + row * stride_g + cols, p.to(tl.bfloat16), mask=m)


def custom_kernel(data):
    logits, targets = data
    logits = logits.contiguous()
    B, V = logits.shape
    lse = torch.empty(B, dtype=torch.float32, device=logits.device)
    loss = torch.empty(B, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits)
    _lse_loss[(B,)](logits, targets, lse, loss, V, logits.stride(0),
                    BLOCK=min(4096, triton.next_power_of_2(V)), num_warps=8)
    block = min(4096, triton.next_power_of_2(V))
    _grad[(B, triton.cdiv(V, block))](logits, targets, lse, grad, V, logits.stride(0), grad.stride(0),
                                      BLOCK=block, num_warps=8)
    return loss, grad
