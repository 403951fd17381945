"""cross_entropy as kernel libraries write it: per-row loss (B,) fp32 and the gradient (B, V) bf16
of logits (B, V) bf16 and targets (B,) int64.

    online_two_pass  one program per row (or a persistent program striding over rows): an
                     online max/normaliser pass over the vocabulary, then a pass writing the
                     gradient (Liger's fused loss-and-gradient kernel)
    three_pass       max, normaliser and gradient each a pass over the row
    whole_row        the row in registers when V fits a block, a looped kernel otherwise
                     (unsloth's dispatch on MAX_FUSED_SIZE)
    split_vocab      the vocabulary split over a second grid dimension: per-chunk logsumexp,
                     combined in PyTorch or a small kernel, then a 2-D gradient kernel
                     (unsloth's chunked cross entropy)
    loss_then_grad   a forward kernel (logsumexp and loss per row) and a separate 2-D backward
                     kernel, as a framework's forward and backward
"""

from __future__ import annotations

from pipelines.generation.styles.library_kernels import glue
from pipelines.generation.styles.library_kernels.glue import (
    Choices,
    Structure,
    TaskSpace,
    dedent,
    indent,
)

TASK = "cross_entropy"
LOG2E = "1.4426950408889634"

DIALECTS = {
    "plain": {},
    "liger": {"logits_ptr": "X_ptr", "targets_ptr": "Y_ptr", "grad_ptr": "dX_ptr", "stride_logits": "X_stride",
              "stride_grad": "dX_stride", "lse_ptr": "LSE_ptr"},
}


def _exp(c: Choices, arg: str) -> str:
    return f"tl.exp2(({arg}) * {LOG2E})" if c.get("exp") == "exp2" else f"tl.exp({arg})"


def _hint(c: Choices, policy: str) -> str:
    return f', eviction_policy="{policy}"' if c.get("cache_hint") else ""


def _row(c: Choices, pid: str = "tl.program_id(0)") -> str:
    return f"{pid}.to(tl.int64)" if c.get("int64") else pid


def _doc(title: str, text: str, c: Choices) -> str:
    return (f"Cross entropy forward and backward over a large vocabulary: {title}.\n\n{glue.wrap_doc(text)}\n\n"
            "loss[b] = logsumexp(logits[b]) - logits[b, target[b]] (fp32); grad[b] = softmax(logits[b]) - "
            f"onehot(target[b]) (bf16).")


def _grad_value(c: Choices, x: str = "x") -> str:
    """softmax of the chunk from the row's statistics (lse, or m and d)."""
    if c.get("grad_form") == "exp_div":
        return f"{_exp(c, f'{x} - m')} / d"
    return f"{_exp(c, f'{x} - lse')}"


def _online_loop(c: Choices, load: str, target_in_loop: bool) -> str:
    """The one-read pass: running max m and normaliser d (and the target's logit)."""
    pick = ("\n    x_target += tl.sum(tl.where(offs == target, x, 0.0), axis=0)" if target_in_loop else "")
    if c.get("online", "scalar") == "vector":
        return dedent(f"""\
        m_vec = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
        d_vec = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_SIZE):
            offs = start + cols
            mask = offs < n_cols
            x = {load}
            m_new = tl.maximum(m_vec, x)
            # lanes that saw only padding keep -inf: shift them by 0 so exp gives 0, not NaN
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            d_vec = d_vec * {_exp(c, "m_vec - shift")} + {_exp(c, "x - shift")}
            m_vec = m_new""") + pick + "\n" + dedent(f"""\
        m = tl.max(m_vec, axis=0)
        d = tl.sum(d_vec * {_exp(c, "m_vec - m")}, axis=0)""")
    return dedent(f"""\
    m = float("-inf")
    d = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + cols
        mask = offs < n_cols
        x = {load}
        m_new = tl.maximum(m, tl.max(x, axis=0))
        d = d * {_exp(c, "m - m_new")} + tl.sum({_exp(c, "x - m_new")}, axis=0)
        m = m_new""") + pick


def _three_pass_stats(c: Choices, load: str, target_in_loop: bool) -> str:
    pick = "\n    x_target += tl.sum(tl.where(offs == target, x, 0.0), axis=0)" if target_in_loop else ""
    return dedent(f"""\
    {glue.ruler("first pass: the row max")}
    m_vec = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + cols
        mask = offs < n_cols
        x = {load}
        m_vec = tl.maximum(m_vec, x)""") + pick + "\n" + dedent(f"""\
    m = tl.max(m_vec, axis=0)
    {glue.ruler("second pass: the normaliser")}
    d_vec = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + cols
        mask = offs < n_cols
        x = {load}
        d_vec += {_exp(c, "x - m")}
    d = tl.sum(d_vec, axis=0)""")


def _row_kernel(c: Choices, name: str, stats: str, decorators: str, persistent: bool) -> str:
    """One row per program (or per iteration of a persistent program): stats, loss, gradient."""
    target_in_loop = c.get("target") == "in_loop"
    grad = dedent(f"""\
    lse = m + tl.log(d)
    tl.store(loss_ptr + row, lse - x_target)
    {glue.ruler("last pass: gradient = softmax - onehot(target)")}
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(row_logits + offs, mask=mask, other=0.0{_hint(c, "evict_first")}).to(tl.float32)
        p = {_grad_value(c)}
        p = tl.where(offs == target, p - 1.0, p)
        tl.store(row_grad + offs, p.to(tl.bfloat16), mask=mask)""")
    pre = dedent("""\
    row_logits = logits_ptr + row * stride_logits
    row_grad = grad_ptr + row * stride_grad
    target = tl.load(targets_ptr + row)""") + "\n"
    if target_in_loop:
        pre += "x_target = 0.0\n"
    else:
        pre += "x_target = tl.load(row_logits + target).to(tl.float32)\n"
    body = pre + stats + "\n" + grad
    if persistent:
        loop = (f"cols = tl.arange(0, BLOCK_SIZE)\nfor row in range({_row(c)}, n_rows, tl.num_programs(0)):\n"
                + indent(body, 4))
    else:
        loop = f"row = {_row(c)}\ncols = tl.arange(0, BLOCK_SIZE)\n" + body
    return f"""\
{decorators}@triton.jit
def {name}(
    # pointers: logits (B, V) bf16, targets (B,) int64, loss (B,) fp32, grad (B, V) bf16
    logits_ptr, targets_ptr, loss_ptr, grad_ptr,
    # strides (elements) and sizes
    stride_logits, stride_grad, n_rows, n_cols,
    # meta-parameters
    BLOCK_SIZE: tl.constexpr,
):
{indent(loop, 4)}"""


def _launcher(c: Choices, for_check: bool, doc: str, body: str, allocs: str = "") -> str:
    head = glue.guard_decorator(c["guard"]) + "def cross_entropy_forward_backward(logits, targets):"
    base = dedent("""\
    assert logits.ndim == 2 and logits.stride(-1) == 1, "expects logits (B, V), row-major"
    n_rows, n_cols = logits.shape
    loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits)""")
    if allocs:
        base += "\n" + allocs
    launch = glue.guard_launch(c["guard"], body, "logits", for_check)
    return "\n".join([head, glue.launcher_doc(doc), indent(base, 4), indent(launch, 4), "    return loss, grad"])


CUSTOM = '''\
def custom_kernel(data):
    logits, targets = data
    return cross_entropy_forward_backward(logits, targets)'''


def _finish(c: Choices, doc: str, parts: list[str], imports: tuple[str, ...], for_check: bool) -> str:
    parts = [glue.guard_part(c["guard"], for_check), *parts, CUSTOM]
    imports = imports + glue.guard_imports(c["guard"], for_check)
    return glue.rename(glue.module(doc, parts, imports), DIALECTS[c["dialect"]])


def _grid(c: Choices, for_check: bool) -> tuple[list[str], str, tuple[str, ...]]:
    """(module parts, grid expression, imports) of a per-row or persistent launch."""
    if c.get("grid") != "persistent":
        return [], "(n_rows,)", ()
    code, sms = glue.sm_count_part(c["sms"], for_check)
    sms = sms.replace("x.device", "logits.device")
    imports = ("functools",) if c["sms"] == "torch_props" and not for_check else ()
    return [code], f"(min(n_rows, {c['per_sm']} * {sms}),)", imports


def _load(c: Choices) -> str:
    return f'tl.load(row_logits + offs, mask=mask, other=float("-inf"){_hint(c, "evict_last")}).to(tl.float32)'


def render_online_two_pass(c: Choices, for_check: bool) -> str:
    name = "_cross_entropy_fused_kernel"
    stats = glue.ruler("first pass: online max and normaliser, one read") + "\n" + _online_loop(
        c, _load(c), c["target"] == "in_loop")
    tuned = c["block"] == "autotune"
    decorators = ""
    if tuned:
        configs = [glue.config({"BLOCK_SIZE": b}, w) for b, w in ((1024, 4), (4096, 8), (8192, 16), (16384, 16), (32768, 32))]
        decorators = glue.autotune(configs, ["n_cols"], for_check, c.get("check_config", 0)) + "\n"
    kernel = _row_kernel(c, name, stats, decorators, c["grid"] == "persistent")
    parts, grid, imports = _grid(c, for_check)
    args = "logits, targets, loss, grad, logits.stride(0), grad.stride(0), n_rows, n_cols"
    launch = f"{name}[{grid}]({args})" if tuned else (
        f"{name}[{grid}]({args}, BLOCK_SIZE={c['block']}, num_warps={c['warps']})")
    doc = _doc("one fused kernel, an online pass and a gradient pass per row",
               "Each row is read twice: once for the running max and rescaled normaliser "
               "(online softmax), once to write softmax - onehot; the loss needs the logsumexp and "
               "the target's logit only. 2 reads of 2 B and one write of 2 B per logit.", c)
    launcher = _launcher(c, for_check, "Fused loss and gradient, one launch.", launch)
    return _finish(c, doc, [*parts, kernel, launcher], imports, for_check)


def render_three_pass(c: Choices, for_check: bool) -> str:
    name = "_cross_entropy_three_pass_kernel"
    stats = _three_pass_stats(c, _load(c), c["target"] == "in_loop")
    kernel = _row_kernel(c, name, stats, "", c["grid"] == "persistent")
    parts, grid, imports = _grid(c, for_check)
    launch = (f"{name}[{grid}](logits, targets, loss, grad, logits.stride(0), grad.stride(0), n_rows, n_cols, "
              f"BLOCK_SIZE={c['block']}, num_warps={c['warps']})")
    doc = _doc("three passes per row: max, normaliser, gradient",
               "The textbook safe softmax: a pass for the max, one for the sum of exponentials, one "
               "to write the gradient; three reads of the logits per row.", c)
    launcher = _launcher(c, for_check, "Three passes per row.", launch)
    return _finish(c, doc, [*parts, kernel, launcher], imports, for_check)


def render_whole_row(c: Choices, for_check: bool) -> str:
    fused = f"""\
@triton.jit
def _cross_entropy_row_kernel(
    logits_ptr, targets_ptr, loss_ptr, grad_ptr,
    stride_logits, stride_grad, n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    {glue.ruler("the whole row in registers: one read, one write")}
    row = {_row(c)}
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    target = tl.load(targets_ptr + row)
    x = tl.load(logits_ptr + row * stride_logits + cols, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = {_exp(c, "x - m")}
    d = tl.sum(e, axis=0)
    lse = m + tl.log(d)
    x_target = tl.sum(tl.where(cols == target, x, 0.0), axis=0)
    tl.store(loss_ptr + row, lse - x_target)
    p = e / d
    p = tl.where(cols == target, p - 1.0, p)
    tl.store(grad_ptr + row * stride_grad + cols, p.to(tl.bfloat16), mask=mask)"""
    looped_c = dict(c, target="scalar_load", online="scalar", grid="per_row")
    stats = glue.ruler("rows wider than a block: online pass, then gradient pass") + "\n" + _online_loop(
        looped_c, 'tl.load(row_logits + offs, mask=mask, other=float("-inf")).to(tl.float32)', False)
    looped = _row_kernel(looped_c, "_cross_entropy_looped_kernel", stats, "", False)
    launch = dedent(f"""\
    args = (logits, targets, loss, grad, logits.stride(0), grad.stride(0))
    if triton.next_power_of_2(n_cols) <= MAX_FUSED_SIZE:
        BLOCK_SIZE, num_warps = calculate_settings(n_cols)
        _cross_entropy_row_kernel[(n_rows,)](*args, n_cols, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps)
    else:
        _cross_entropy_looped_kernel[(n_rows,)](*args, n_rows, n_cols, BLOCK_SIZE={c["fallback_block"]}, num_warps={c["fallback_warps"]})""")
    doc = _doc("the whole row in registers when it fits, a looped kernel beyond",
               f"Vocabularies up to MAX_FUSED_SIZE = {c['max_fused']} columns are loaded whole: one read "
               "and one write per logit. Wider rows go to an online two-pass kernel.", c)
    launcher = _launcher(c, for_check, "Whole-row kernel or looped fallback.", launch)
    settings = glue.settings_part(c["warps"], c["max_fused"])
    return _finish(c, doc, [settings, fused, looped, launcher], (), for_check)


def render_split_vocab(c: Choices, for_check: bool) -> str:
    chunk_kernel = f"""\
@triton.jit
def _cross_entropy_chunk_lse_kernel(
    logits_ptr, lse_parts_ptr,
    stride_logits, n_cols, n_chunks,
    CHUNK: tl.constexpr,
):
    {glue.ruler("grid (rows, chunks): logsumexp of one CHUNK of the vocabulary")}
    row = {_row(c)}
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < n_cols
    x = tl.load(logits_ptr + row * stride_logits + offs, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(lse_parts_ptr + row * n_chunks + chunk, m + tl.log(tl.sum({_exp(c, "x - m")}, axis=0)))"""
    combine_kernel = f"""\
@triton.jit
def _cross_entropy_combine_kernel(
    lse_parts_ptr, logits_ptr, targets_ptr, lse_ptr, loss_ptr,
    stride_logits, n_chunks,
    CHUNKS_BLOCK: tl.constexpr,
):
    {glue.ruler("one program per row: merge the chunks' logsumexp, the loss")}
    row = {_row(c)}
    s = tl.arange(0, CHUNKS_BLOCK)
    parts = tl.load(lse_parts_ptr + row * n_chunks + s, mask=s < n_chunks, other=float("-inf"))
    m = tl.max(parts, axis=0)
    lse = m + tl.log(tl.sum({_exp(c, "parts - m")}, axis=0))
    target = tl.load(targets_ptr + row)
    x_target = tl.load(logits_ptr + row * stride_logits + target).to(tl.float32)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, lse - x_target)"""
    grad_kernel = f"""\
@triton.jit
def _cross_entropy_grad_kernel(
    logits_ptr, targets_ptr, lse_ptr, grad_ptr,
    stride_logits, stride_grad, n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    {glue.ruler("grid (rows, blocks): gradient = exp(x - lse) - onehot(target)")}
    row = {_row(c)}
    offs = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + row)
    x = tl.load(logits_ptr + row * stride_logits + offs, mask=mask, other=0.0).to(tl.float32)
    p = {_exp(c, "x - lse")}
    p = tl.where(offs == target, p - 1.0, p)
    tl.store(grad_ptr + row * stride_grad + offs, p.to(tl.bfloat16), mask=mask)"""
    lines = [
        f"CHUNK = {c['chunk']}",
        "n_chunks = triton.cdiv(n_cols, CHUNK)",
        "lse_parts = torch.empty((n_rows, n_chunks), dtype=torch.float32, device=logits.device)",
        f"_cross_entropy_chunk_lse_kernel[(n_rows, n_chunks)](logits, lse_parts, logits.stride(0), n_cols, n_chunks, "
        f"CHUNK=CHUNK, num_warps={c['warps']})",
    ]
    kernels = [chunk_kernel]
    if c["combine"] == "torch":
        lines += [
            "# merging a few partial logsumexps per row is cheap in PyTorch",
            "lse = torch.logsumexp(lse_parts, dim=1)",
            "loss = lse - logits.gather(1, targets.unsqueeze(1)).squeeze(1).float()",
        ]
    else:
        kernels.append(combine_kernel)
        lines += [
            "lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)",
            "_cross_entropy_combine_kernel[(n_rows,)](lse_parts, logits, targets, lse, loss, logits.stride(0), n_chunks, "
            "CHUNKS_BLOCK=triton.next_power_of_2(n_chunks), num_warps=1)",
        ]
    kernels.append(grad_kernel)
    lines.append(
        f"_cross_entropy_grad_kernel[(n_rows, triton.cdiv(n_cols, {c['grad_block']}))](logits, targets, lse, grad, "
        f"logits.stride(0), grad.stride(0), n_cols, BLOCK_SIZE={c['grad_block']}, num_warps={c['grad_warps']})")
    where = "in PyTorch (logsumexp, gather)" if c["combine"] == "torch" else "by a small per-row kernel"
    doc = _doc("the vocabulary split over a second grid dimension",
               f"Grid (rows, V / CHUNK) computes one logsumexp per chunk; the chunks of a row are merged "
               f"{where}; a 2-D kernel writes the gradient. The logits are read twice, every launch has "
               "many programs.", c)
    launcher = _launcher(c, for_check, "Chunked logsumexp, merge, gradient.", "\n".join(lines))
    return _finish(c, doc, [*kernels, launcher], (), for_check)


def render_loss_then_grad(c: Choices, for_check: bool) -> str:
    target_in_loop = c["target"] == "in_loop"
    stats = _online_loop(dict(c, online="scalar"), _load(c), target_in_loop)
    tuned = c["fwd_block"] == "autotune"
    decorators = ""
    if tuned:
        configs = [glue.config({"BLOCK_SIZE": b}, w) for b, w in ((2048, 4), (4096, 8), (8192, 8), (16384, 16))]
        decorators = glue.autotune(configs, ["n_cols"], for_check, c.get("check_config", 0)) + "\n"
    fwd = f"""\
{decorators}@triton.jit
def _cross_entropy_fwd_kernel(
    logits_ptr, targets_ptr, loss_ptr, lse_ptr,
    stride_logits, n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    {glue.ruler("forward: logsumexp and loss of one row, one read")}
    row = {_row(c)}
    row_logits = logits_ptr + row * stride_logits
    cols = tl.arange(0, BLOCK_SIZE)
    target = tl.load(targets_ptr + row)
    x_target = {"0.0" if target_in_loop else "tl.load(row_logits + target).to(tl.float32)"}
{indent(stats, 4)}
    lse = m + tl.log(d)
    tl.store(lse_ptr + row, lse)
    tl.store(loss_ptr + row, lse - x_target)"""
    bwd = f"""\
@triton.jit
def _cross_entropy_bwd_kernel(
    logits_ptr, targets_ptr, lse_ptr, grad_ptr,
    stride_logits, stride_grad, n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    {glue.ruler("backward: grid (rows, blocks), softmax - onehot from the saved logsumexp")}
    row = {_row(c)}
    offs = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + row)
    x = tl.load(logits_ptr + row * stride_logits + offs, mask=mask, other=0.0).to(tl.float32)
    p = {_exp(c, "x - lse")}
    tl.store(grad_ptr + row * stride_grad + offs, tl.where(offs == target, p - 1.0, p).to(tl.bfloat16), mask=mask)"""
    fwd_args = "logits, targets, loss, lse, logits.stride(0), n_cols"
    fwd_launch = (f"_cross_entropy_fwd_kernel[(n_rows,)]({fwd_args})" if tuned else
                  f"_cross_entropy_fwd_kernel[(n_rows,)]({fwd_args}, BLOCK_SIZE={c['fwd_block']}, num_warps={c['fwd_warps']})")
    launch = "\n".join([
        fwd_launch,
        f"_cross_entropy_bwd_kernel[(n_rows, triton.cdiv(n_cols, {c['grad_block']}))](logits, targets, lse, grad, "
        f"logits.stride(0), grad.stride(0), n_cols, BLOCK_SIZE={c['grad_block']}, num_warps={c['grad_warps']})",
    ])
    doc = _doc("a forward kernel, then a separate backward kernel",
               "As a framework runs them: the forward saves the logsumexp of each row, the backward "
               "reads the logits again over a (rows, V / BLOCK) grid. Two reads, two launches.", c)
    launcher = _launcher(c, for_check, "Forward, then backward.", launch,
                         "lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)")
    return _finish(c, doc, [fwd, bwd, launcher], (), for_check)


def _fits(c: Choices) -> bool:
    """At most 128 elements of a block per thread (wider blocks spill beyond any use)."""
    block, warps = c.get("block"), c.get("warps")
    if block in (None, "autotune") or warps is None:
        return True
    return block // (32 * warps) <= 128


def space() -> TaskSpace:
    common = {"dialect": tuple(DIALECTS), "guard": glue.LAUNCH_GUARDS, "exp": ("exp", "exp2"),
              "int64": (False, True)}
    grid = {"grid": ("per_row", "persistent"),
            "sms": lambda c: glue.SM_SOURCES if c["grid"] == "persistent" else None,
            "per_sm": lambda c: (1, 2, 4) if c["grid"] == "persistent" else None}
    structures = (
        Structure("online_two_pass", "online max/normaliser pass, then gradient pass",
                  {**common, **grid, "block": (1024, 2048, 4096, 8192, 16384, 32768, "autotune"),
                   "warps": lambda c: None if c["block"] == "autotune" else (4, 8, 16, 32),
                   "online": ("scalar", "vector"), "target": ("scalar_load", "in_loop"),
                   "grad_form": ("exp_lse", "exp_div"), "cache_hint": (False, True)},
                  render_online_two_pass, valid=_fits),
        Structure("three_pass", "max, normaliser and gradient passes",
                  {**common, **grid, "block": (512, 1024, 4096, 16384), "warps": (2, 4, 8, 16),
                   "target": ("scalar_load", "in_loop"), "grad_form": ("exp_lse", "exp_div"),
                   "cache_hint": (False, True)}, render_three_pass, valid=_fits),
        Structure("whole_row", "whole row in registers, looped fallback",
                  {**common, "max_fused": (32768, 65536), "warps": ("scaled", "lean", "wide"),
                   "fallback_block": (2048, 4096, 8192), "fallback_warps": (8, 16)}, render_whole_row),
        Structure("split_vocab", "vocabulary split over the grid, merged, 2-D gradient",
                  {**common, "chunk": (2048, 4096, 8192, 16384), "warps": (4, 8, 16),
                   "combine": ("torch", "kernel"), "grad_block": (1024, 2048, 4096, 8192),
                   "grad_warps": (4, 8)}, render_split_vocab),
        Structure("loss_then_grad", "forward kernel, separate backward kernel",
                  {**common, "fwd_block": (1024, 4096, 16384, "autotune"),
                   "fwd_warps": lambda c: None if c["fwd_block"] == "autotune" else (4, 8, 16),
                   "target": ("scalar_load", "in_loop"), "grad_block": (512, 1024, 4096, 8192),
                   "grad_warps": (2, 4, 8)}, render_loss_then_grad),
    )
    return TaskSpace(TASK, structures)
