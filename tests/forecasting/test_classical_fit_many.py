"""The classical forecasters fitted side by side in worker processes: the same models as one
after another here, in job order, and a bad split a one-line error."""

from __future__ import annotations

import json
import random

import numpy as np
import polars as pl
import pytest

from models.bins import speedup_to_bin
from pipelines.surrogates.classical import fit_many, frame_of
from pipelines.surrogates.roles import Roles

BLOCKS = (64, 128, 256, 512, 1024)


def _toy(n: int, seed: int, prefix: str):
    rng = random.Random(seed)
    records = {"ref": {"kernel_id": "ref", "task": "softmax", "source": "def ref_kernel(x): return x.softmax(-1)\n",
                       "language": "pytorch", "generator": "reference", "algorithm": None, "knobs_json": None}}
    rows = []
    for i in range(n):
        b = rng.choice(BLOCKS)
        s = 2.0 ** (-2.0 + 0.9 * BLOCKS.index(b) + rng.gauss(0, 0.1))
        kid = f"{prefix}{i}"
        records[kid] = {"kernel_id": kid, "task": "softmax", "language": "triton", "generator": "kernelcast-space",
                        "algorithm": "two_pass", "knobs_json": json.dumps({"BLOCK_N": b}),
                        "source": f"BLOCK_N = {b}\n@triton.jit\ndef k(x):\n    tl.load(x)\n"}
        rows.append({"pair_id": f"p-{kid}", "task": "softmax", "hardware_id": "h", "anchor_kernel_id": "ref",
                     "candidate_kernel_id": kid, "speedup": s, "true_bin": speedup_to_bin(s)})
    return records, pl.DataFrame(rows)


def _roles():
    rec_f, fit = _toy(120, 0, "f")
    rec_c, cal = _toy(40, 1, "c")
    rec_e, ev = _toy(30, 2, "e")
    return Roles(fit, cal, ev, fit.head(0), cal.head(0), ev.head(0), None), {**rec_f, **rec_c, **rec_e}


def test_workers_fit_the_same_models_in_job_order():
    roles, records = _roles()
    jobs = [("cost_model", "in_distribution", {"max_iter": 30}), ("text_model", "in_distribution", {"max_features": 500})]
    lines: list[str] = []
    here = fit_many(jobs, roles, records, workers=1)
    there = fit_many(jobs, roles, records, workers=2, progress=lines.append)
    assert [f.kind for f in there] == ["cost_model", "text_model"]
    frame = frame_of(roles.eval, records)
    for a, b in zip(here, there, strict=True):
        np.testing.assert_allclose(a.model.predict_proba(frame), b.model.predict_proba(frame), rtol=0, atol=1e-9)
        assert a.metrics["fit_pairs"] == b.metrics["fit_pairs"] == 120.0
    assert len(lines) == 2 and all("fit on 120 pairs" in line for line in lines)


def test_a_split_without_fit_pairs_is_a_one_line_error():
    roles, records = _roles()
    with pytest.raises(ValueError, match="no fit pairs for split 'held_out_task'"):
        fit_many([("cost_model", "held_out_task", {"max_iter": 5}), ("cost_model", "in_distribution", {"max_iter": 5})],
                 roles, records, workers=2)
