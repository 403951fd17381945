"""Fixes for Triton 3.6's CPU interpreter (TRITON_INTERPRET=1), applied where kernels run on CPU.

bf16 tl.dot: the interpreter stores bfloat16 tensors as raw uint16 bit patterns and its
`create_dot` multiplies those integers, so every bf16 matmul comes out as garbage (~1e10) while
fp16/fp32 are right. We widen bf16 operands to fp32 first (exact: bf16 is the top half of an
fp32), which is also what the tensor cores do with an fp32 accumulator. Only the interpreter is
touched; GPU compilation never sees this.
"""

from __future__ import annotations

import numpy as np

_PATCHED = False


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def patch_triton_interpreter() -> bool:
    """Install the fixes once per process. Returns True if the patch is (now) in place."""
    global _PATCHED
    if _PATCHED:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except Exception:  # no triton: nothing to fix
        return False
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a_data = _bf16_bits_to_f32(a.data) if a.dtype.scalar == tl.bfloat16 else a.data.astype(np.float32)
            b_data = _bf16_bits_to_f32(b.data) if b.dtype.scalar == tl.bfloat16 else b.data.astype(np.float32)
            out = np.matmul(a_data, b_data, dtype=np.float32).astype(d.data.dtype) + d.data
            return interpreter.TensorHandle(out, d.dtype.scalar)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot
    _PATCHED = True
    return True
