"""Cases shared by the row-wise tasks over an (M, N) bf16 matrix (softmax, rms_norm, layer_norm):
each row is reduced, then written, so the same shapes exercise all three."""

from __future__ import annotations

from pipelines.tasks.contract import Case

# Ragged rows: N = 1000 and 4099 end inside a block of any power-of-two size, so the masked
# tail is checked; 128 is one whole small block. Few rows keep the interpreter to seconds.
CORRECTNESS_CASES: tuple[Case, ...] = (
    {"M": 11, "N": 1000, "seed": 1},
    {"M": 5, "N": 4099, "seed": 2},
    {"M": 20, "N": 128, "seed": 3},
)

# The norms' benchmark rows are 4096 to 16384 wide, one width (5120) not a power of two.
NORM_BENCHMARK_CASES: tuple[Case, ...] = (
    {"M": 8192, "N": 8192, "seed": 11},
    {"M": 16384, "N": 4096, "seed": 12},
    {"M": 2048, "N": 16384, "seed": 13},
    {"M": 6144, "N": 5120, "seed": 14},
)
