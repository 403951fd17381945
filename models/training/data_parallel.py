"""Data-parallel plumbing of the supervised trainer (models.training.supervised), through accelerate.

One process, or N under `accelerate launch --config_file deploy/accelerate/multi_gpu.yaml
--num_processes N`: the same calls. Each optimizer step is one length-bucketed batch; every
process trains on its own contiguous share of the batch's rows, and the loss is weighted so
that the gradients accelerate averages over the processes are the gradient of the whole batch.
The run is therefore the same on 1 or N processes (up to float summation order): the settings
decide the model, the processes only the speed (and the memory each GPU needs).

Every decision that ends a loop (the clock, the wall-clock budget) is taken by all processes
together: a process that stopped alone would leave the others waiting in a gradient all-reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def make_accelerator() -> Any:
    """The process's Accelerator; `cpu` on a host without CUDA, so that a launch of several
    processes there is data-parallel over gloo instead of N independent single-process runs."""
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available())


def is_main_process() -> bool:
    """False in the processes of a distributed launch other than the main one (True alone)."""
    from accelerate import PartialState

    return bool(PartialState().is_main_process)


def row_share(accelerator: Any, batch: Sequence[int]) -> list[int]:
    """This process's contiguous share of a batch's rows (empty when the batch has fewer rows
    than there are processes).

    >>> from types import SimpleNamespace
    >>> [row_share(SimpleNamespace(num_processes=2, process_index=i), [7, 8, 9]) for i in (0, 1)]
    [[7, 8], [9]]
    """
    n, rank = accelerator.num_processes, accelerator.process_index
    per, extra = divmod(len(batch), n)
    start = rank * per + min(rank, extra)
    return list(batch[start:start + per + (1 if rank < extra else 0)])


def share_weight(accelerator: Any, share_rows: int, batch_rows: int) -> float:
    """Factor on a share's mean loss so that the average over processes is the batch mean.

    The processes' gradients are averaged (divided by N), so a share of n_r of the batch's n rows
    weighs n_r * N / n; 1.0 exactly on one process.
    """
    return share_rows * accelerator.num_processes / batch_rows


def any_process(accelerator: Any, flag: bool) -> bool:
    """True on every process when `flag` is true on at least one."""
    if accelerator.num_processes == 1:
        return flag
    agreed = accelerator.reduce(torch.tensor([float(flag)], device=accelerator.device), reduction="sum")
    return bool(agreed.item() > 0)


def sum_over_processes(accelerator: Any, values: Sequence[float]) -> list[float]:
    """Element-wise sums of per-process numbers (rows, loss sums, tokens), on every process."""
    if accelerator.num_processes == 1:
        return list(values)
    total = accelerator.reduce(torch.tensor(list(values), dtype=torch.float64, device=accelerator.device),
                               reduction="sum")
    return total.cpu().tolist()


def gather_rows(accelerator: Any, indices: Sequence[int], values: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, k) rows that the processes computed for their `indices`, in index order, on every
    process (every process then takes the same early-stopping and best-epoch decisions)."""
    if accelerator.num_processes == 1:
        return values
    from accelerate.utils import gather_object

    out = torch.zeros(n, values.shape[1], dtype=values.dtype)
    for part_indices, part_values in gather_object([(list(indices), values.tolist())]):
        if part_indices:
            out[part_indices] = torch.tensor(part_values, dtype=values.dtype)
    return out
