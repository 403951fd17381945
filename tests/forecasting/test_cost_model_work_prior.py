"""The cost model's work prior: work features from the trace, the log ratio of candidate to anchor,
and forecasts for candidates of a launch kind (PyTorch programs) the trees never saw."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest

from models.bins import speedup_to_bin
from models.classical import CostModel
from models.classical.features import (
    FeatureSpace,
    kernel_features,
    pair_frame,
    work_features,
    work_ratio,
)
from models.classical.work_prior import WorkPrior, launch_kinds

ANCHOR = {"kernel_id": "ref", "task": "softmax", "language": "pytorch", "generator": "reference",
          "source": "def custom_kernel(data):\n    return data[0].float().softmax(-1).bfloat16()\n",
          "trace_launches": 0.0, "torch_ops": 3.0, "call_bytes_log2": 28.0, "input_bytes_log2": 25.0,
          "torch_flops_log2": 0.0}

TRITON = ("@triton.jit\ndef k(x, y, N: tl.constexpr):\n    tl.store(y, tl.load(x))\n"
          "def custom_kernel(data):\n    y = torch.empty_like(data[0])\n    k[(1,)](data[0], y, N={n})\n    return y\n")
PYTORCH = ("import torch\n\ndef custom_kernel(data):\n    (x,) = data\n    out = torch.empty_like(x)\n"
           "    for xb, ob in zip(x.split({rows}), out.split({rows})):\n        ob.copy_(xb.float().softmax(-1))\n"
           "    return out\n")


def triton_pairs(n: int, seed: int = 0, generator: str = "library-triton"):
    """Triton candidates (one launch each) whose bytes moved decide log2 S: fewer bytes than the
    anchor, faster, along log2 S = -(bytes ratio) + noise."""
    rng = random.Random(seed)
    cands, log2s = [], []
    for i in range(n):
        nbytes = rng.uniform(24.0, 27.5)
        cands.append({"kernel_id": f"t{seed}-{i}", "task": "softmax", "language": "triton", "generator": generator,
                      "algorithm": f"algo{i % 3}", "source": TRITON.format(n=2 ** (i % 5 + 6)),
                      "trace_launches": 1.0, "torch_ops": 1.0, "call_bytes_log2": nbytes, "input_bytes_log2": 25.0,
                      "torch_flops_log2": 0.0})
        log2s.append(28.0 - nbytes + rng.gauss(0, 0.2))
    return pair_frame([ANCHOR] * n, cands), np.array(log2s)


def pytorch_candidate(i: int, ops: float, nbytes: float, generator: str = "pytorch-programs") -> dict:
    return {"kernel_id": f"p{i}", "task": "softmax", "language": "pytorch", "generator": generator,
            "algorithm": "blocks", "source": PYTORCH.format(rows=2 ** (i % 4 + 5)), "trace_launches": 0.0,
            "torch_ops": ops, "call_bytes_log2": nbytes, "input_bytes_log2": 25.0, "torch_flops_log2": 0.0}


def fitted(frame: pd.DataFrame, log2s: np.ndarray, **params) -> CostModel:
    model = CostModel(max_iter=60, min_samples_leaf=5, **params)
    model.fit(frame, [speedup_to_bin(2.0 ** v) for v in log2s], log2s)
    return model


def test_work_features_of_a_program_and_of_a_triton_module_are_the_same_measures():
    # a program of 40 torch ops moving 2^30 bytes against one launch (and its allocation's op) of 2^26
    program = work_features({"trace_launches": 0.0, "torch_ops": 40.0, "call_bytes_log2": 30.0,
                             "input_bytes_log2": 26.0, "torch_flops_log2": 0.0})
    triton = work_features({"trace_launches": 1.0, "torch_ops": 1.0, "call_bytes_log2": 26.0,
                            "input_bytes_log2": 26.0, "torch_flops_log2": 0.0})
    assert program["work:launches_log2"] == pytest.approx(math.log2(41.0))
    assert triton["work:launches_log2"] == pytest.approx(math.log2(3.0))
    assert program["work:traffic_log2"] == 4.0 and triton["work:traffic_log2"] == 0.0
    assert program["work:time_log2"] > triton["work:time_log2"] + 3.5  # 16x the bytes, more launches
    # no trace: unknown, never zero
    assert all(math.isnan(v) for v in work_features({}).values())


def test_work_ratio_is_the_candidate_minus_anchor_log_ratio():
    frame = pair_frame([ANCHOR, ANCHOR], [pytorch_candidate(0, 3.0, 28.0), pytorch_candidate(1, 3.0, 29.0)])
    ratio = work_ratio(frame)
    assert ratio[0] == pytest.approx(0.0)  # the anchor's own work
    assert ratio[1] == pytest.approx(1.0, abs=1e-3)  # twice the bytes of a bytes-bound call: twice the time


GEMM_REF = {"kernel_id": "gemm-ref", "task": "matmul_bias_gelu", "language": "pytorch", "generator": "reference",
            "source": "def custom_kernel(data):\n    a, b, bias = data\n    return (a @ b + bias)\n",
            "trace_launches": 0.0, "torch_ops": 3.0, "call_bytes_log2": 29.0, "input_bytes_log2": 26.0,
            "torch_flops_log2": 37.0}


def gemm_candidate(i: int, wgmma: float, nbytes: float = 27.0) -> dict:
    """A Triton GEMM (one launch): the trace counts none of its flops; its PTX tells whether its
    dots run on tensor cores."""
    return {"kernel_id": f"g{i}", "task": "matmul_bias_gelu", "language": "triton", "generator": "library-triton",
            "source": TRITON.format(n=64), "trace_launches": 1.0, "torch_ops": 1.0, "call_bytes_log2": nbytes,
            "input_bytes_log2": 26.0, "torch_flops_log2": 0.0, "ptx_instructions": 2000.0, "ptx_wgmma": wgmma}


def test_a_triton_gemm_does_the_anchors_arithmetic_at_the_rate_of_its_units():
    """The trace counts the reference's cuBLAS flops but none of a Triton kernel's: the pair's
    estimates share the larger count, on tensor cores where the PTX has them, else on CUDA cores."""
    frame = pair_frame([GEMM_REF] * 3, [gemm_candidate(0, 16.0), gemm_candidate(1, 0.0),
                                        {**GEMM_REF, "kernel_id": "same"}])
    tensor, cuda_cores, same = work_ratio(frame)
    assert same == pytest.approx(0.0)
    # fewer bytes, the same tensor-core arithmetic: a little faster, not 2^-3 of the time
    assert -1.0 < tensor < 0.0
    assert cuda_cores > tensor + 2.0  # 2^37 flops at the fp32 rate, a fraction of the tensor cores'
    # the candidate as the anchor: the same arithmetic, the ratio's sign turned
    swapped = pair_frame([gemm_candidate(0, 16.0)], [GEMM_REF])
    assert work_ratio(swapped)[0] == pytest.approx(-tensor)


def test_a_program_whose_products_the_trace_cannot_see_does_them_on_cuda_cores():
    """A product written as a broadcast multiply and a sum is no matrix op for the flop counter:
    the program does the anchor's arithmetic off the tensor cores."""
    program = {**GEMM_REF, "kernel_id": "bcast", "generator": "pytorch-programs", "torch_flops_log2": 0.0}
    ratio = work_ratio(pair_frame([GEMM_REF], [program]))[0]
    assert ratio > 2.0
    kind = work_features({**GEMM_REF, **{"ptx_instructions": 10.0}})["work:tensor_cores"]
    assert kind == 0.0 and math.isnan(work_features(GEMM_REF)["work:tensor_cores"])


def test_a_call_of_many_small_ops_waits_on_the_host_and_a_large_one_on_the_device():
    """Launches are asynchronous: the estimate is the longer of the host's queueing and the device's
    roofline, not their sum."""
    small = [work_features({"trace_launches": 0.0, "torch_ops": 400.0, "call_bytes_log2": b, "input_bytes_log2": 20.0})
             for b in (20.0, 21.0)]
    assert small[0]["work:time_log2"] == pytest.approx(small[1]["work:time_log2"])  # 400 launches, either way
    assert small[0]["work:time_log2"] == pytest.approx(math.log2(400 * 5.0))
    large = [work_features({"trace_launches": 0.0, "torch_ops": 4.0, "call_bytes_log2": b, "input_bytes_log2": 30.0})
             for b in (31.0, 32.0)]
    assert large[1]["work:time_log2"] - large[0]["work:time_log2"] == pytest.approx(1.0, abs=1e-3)  # bytes-bound


def test_work_features_are_not_columns_of_the_trees():
    frame, log2s = triton_pairs(60)
    space = FeatureSpace().fit(frame)
    assert "work:time_log2" in kernel_features(frame.iloc[0].filter(like="c_").rename(lambda c: c[2:]).to_dict())
    assert not [c for c in space.columns if "work:" in c]


def test_a_program_unlike_every_fitted_candidate_is_forecast_by_the_line():
    """Fitted on Triton kernels only, the trees would forecast a program from what faster Triton
    kernels were; the prior's line forecasts it slower the more work it does than the anchor."""
    frame, log2s = triton_pairs(120)
    model = fitted(frame, log2s)
    assert model.prior_.kinds == {"triton": 120} and model.prior_.slope < -0.5
    programs = pair_frame([ANCHOR] * 3, [pytorch_candidate(0, 3.0, 28.0), pytorch_candidate(1, 60.0, 30.0),
                                         pytorch_candidate(2, 400.0, 31.0)])
    assert launch_kinds(programs).tolist() == ["torch"] * 3
    mu = model.predict_log2(programs)
    assert mu[0] > mu[1] > mu[2] and mu[2] < -1.5  # more work than the anchor, slower
    assert abs(mu[0]) < 1.0  # the anchor's own work: about its time
    without = fitted(frame, log2s, work_prior=False).predict_log2(programs)
    assert without.min() > 0.0  # what the trees alone say of them: faster than the anchor
    p = model.predict_proba(programs)
    assert np.allclose(p.sum(axis=1), 1.0) and np.argmax(p[2]) + 1 <= 2


def test_the_trees_alone_forecast_the_kinds_and_range_they_were_fitted_on():
    frame, log2s = triton_pairs(120)
    with_prior, without = fitted(frame, log2s), fitted(frame, log2s, work_prior=False)
    test_frame, _ = triton_pairs(30, seed=1)
    assert np.allclose(with_prior.predict_log2(test_frame), without.predict_log2(test_frame))
    # past the fitted range (more bytes than any fitted Triton kernel moved): lower than the trees say
    past = pair_frame([ANCHOR], [{**test_frame.filter(like="c_").iloc[0].rename(lambda c: c[2:]).to_dict(),
                                  "call_bytes_log2": 31.0}])
    assert with_prior.predict_log2(past)[0] < without.predict_log2(past)[0] - 2.0


def test_the_generator_and_family_names_are_not_features():
    frame, log2s = triton_pairs(80)
    model = fitted(frame, log2s)
    assert not [c for c in model.space_.columns if "generator" in c or "family" in c]
    renamed, _ = triton_pairs(80, generator="someone-else")
    renamed["c_algorithm"] = "another"
    test_frame = pair_frame([ANCHOR] * 2, [pytorch_candidate(0, 30.0, 29.0), pytorch_candidate(1, 5.0, 28.0)])
    other = pair_frame([ANCHOR] * 2, [pytorch_candidate(0, 30.0, 29.0, "hand-written"),
                                      pytorch_candidate(1, 5.0, 28.0, "hand-written")])
    assert np.allclose(model.predict_log2(frame), model.predict_log2(renamed))
    assert np.allclose(model.predict_proba(test_frame), model.predict_proba(other))


def test_no_line_without_enough_pairs_of_a_known_ratio():
    prior = WorkPrior.fit(np.array([np.nan] * 30), np.zeros(30), np.array(["unknown"] * 30))
    assert prior.slope is None and not prior.novel(np.array(["torch"])).any()
    assert prior.predict(np.array([5.0])).tolist() == [0.0]


def test_the_trace_of_tiny_programs_counts_their_launches_and_bytes():
    """The trace (pipelines.forecasting.source_features, fake tensors) of programs written here: a
    Python loop over row blocks launches an op per block, an fp32 upcast moves more bytes."""
    from pipelines.forecasting.source_features import source_features_many

    fused = "import torch\n\ndef custom_kernel(data):\n    return torch.softmax(data[0], dim=-1)\n"
    upcast = ("import torch\n\ndef custom_kernel(data):\n"
              "    return torch.softmax(data[0].float(), dim=-1).to(data[0].dtype)\n")
    blocks = PYTORCH.format(rows=128)
    rows = source_features_many([{"task": "softmax", "source": s, "language": "pytorch"} for s in (fused, upcast, blocks)],
                                n_workers=1)
    assert [r["status"] for r in rows] == ["ok"] * 3, [r["error"] for r in rows]
    work = [work_features(r) for r in rows]
    assert rows[0]["torch_ops"] >= 1 and rows[1]["torch_ops"] > rows[0]["torch_ops"]
    assert rows[1]["torch_bytes_log2"] > rows[0]["torch_bytes_log2"] + 1.0  # fp32 copies in and out
    assert rows[2]["torch_ops"] > 4 * rows[1]["torch_ops"]  # an op or more per block of 128 rows
    assert work[0]["work:time_log2"] < work[1]["work:time_log2"] < work[2]["work:time_log2"]


def test_the_portable_twin_applies_the_prior(tmp_path):
    from models.classical.portable import PortableCostModel

    frame, log2s = triton_pairs(120)
    model = fitted(frame, log2s)
    model.calibrate(*(lambda f, y: (f, [speedup_to_bin(2.0 ** v) for v in y]))(*triton_pairs(40, seed=2)))
    programs = pair_frame([ANCHOR] * 2, [pytorch_candidate(0, 60.0, 30.0), pytorch_candidate(1, 3.0, 28.0)])
    both = pd.concat([programs, triton_pairs(5, seed=3)[0]], ignore_index=True)
    twin = PortableCostModel.from_cost_model(model)
    loaded = PortableCostModel.load(twin.save(tmp_path / "m.npz"))
    for m in (twin, loaded):
        assert np.allclose(m.predict_log2(both), model.predict_log2(both))
        assert np.allclose(m.predict_proba(both), model.predict_proba(both))
