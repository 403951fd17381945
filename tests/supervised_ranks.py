"""One process of a data-parallel supervised run on the tiny model, started N times by
`accelerate launch` from tests/models/test_supervised_parallel.py.

    accelerate launch --config_file deploy/accelerate/multi_gpu.yaml --num_processes 2 \
        tests/supervised_ranks.py WORK

Each process trains with the same call a single process makes, with its own out and checkpoint
folders (WORK/out-<rank>, WORK/ckpt-<rank>), so the test sees which processes wrote. It records
what only a process knows: the rows it fed the model (a digest of each row's tokens) and the
weights it ended with (WORK/rank-<rank>.pt), and the epoch records its callback received.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from supervised_toy import parallel_case

import models.training.supervised as supervised


def row_digest(tokens: list[int]) -> str:
    return hashlib.sha1(json.dumps(tokens).encode()).hexdigest()


def main(work: Path) -> None:
    from models.training.data_parallel import make_accelerator

    rank = make_accelerator().process_index
    fed: list[str] = []
    models: list[torch.nn.Module] = []
    real_forward, real_load = supervised.LabelReadout.forward, supervised._load

    def recording_forward(self, ids, mask, positions, label_ids):  # training forwards only
        fed.extend(row_digest(row[m.bool()].tolist()) for row, m in zip(ids, mask, strict=True))
        return real_forward(self, ids, mask, positions, label_ids)

    def keeping_load(settings, accelerator):  # the model this process trains, to read its weights after
        loaded = real_load(settings, accelerator)
        models.append(loaded[0])
        return loaded

    supervised.LabelReadout.forward, supervised._load = recording_forward, keeping_load
    settings, train, calibration = parallel_case()
    epochs: list[dict] = []
    supervised.train_supervised(settings, train, calibration, work / f"out-{rank}", work / f"ckpt-{rank}",
                                on_epoch=epochs.append)
    torch.save({k: v.detach().clone() for k, v in models[0].state_dict().items()}, work / f"rank-{rank}.pt")
    (work / f"rank-{rank}.json").write_text(json.dumps({"fed": fed, "epochs": epochs}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
