"""The portable cost model forecasts what the fitted one forecasts, with numpy and pandas only."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from models.bins import speedup_to_bin
from models.classical import CostModel
from models.classical.features import pair_frame
from models.classical.portable import PortableCostModel
from pipelines.search import space
from tests.forecasting.test_forecasting_models import toy_pairs


def mixed_pairs(n: int, seed: int):
    """Two families, a string knob, compile features known for some kernels only, and Triton
    anchors: every kind of split the trees make (numeric, categorical, missing)."""
    rng = random.Random(seed)
    anchors, cands, log2s = [], [], []
    for i in range(n):
        algo = rng.choice(("two_pass", "online", "one_pass"))
        block = rng.choice((64, 128, 256, 512, 1024))
        impl = rng.choice(("exp", "exp2", "fast"))
        regs = rng.choice((None, 32, 64, 128))
        anchor_block = rng.choice((64, 256))
        log2s.append(0.5 * np.log2(block / anchor_block) + (0.6 if algo == "online" else 0.0)
                     + (0.3 if impl == "exp2" else 0.0) - (0.4 if regs == 128 else 0.0) + rng.gauss(0, 0.1))
        anchors.append({"kernel_id": f"a{i}", "task": rng.choice(("softmax", "rms_norm")), "language": "triton",
                        "generator": "kernelcast-space", "algorithm": "two_pass",
                        "knobs_json": json.dumps({"BLOCK_N": anchor_block}), "source": "tl.load(x)\n",
                        "n_regs": 40})
        cands.append({"kernel_id": f"c{seed}-{i}", "task": anchors[-1]["task"], "language": "triton",
                      "generator": "kernelcast-space", "algorithm": algo,
                      "knobs_json": json.dumps({"BLOCK_N": block, "exp_impl": impl}, sort_keys=True),
                      "source": "tl.load(x)\n" * (1 + block // 256) + "tl.exp2(y)\n" * (impl == "exp2"),
                      "n_regs": regs})
    y = np.array([speedup_to_bin(2.0 ** v) for v in log2s])
    return pair_frame(anchors, cands), y, np.array(log2s)


@pytest.fixture(scope="module")
def fitted() -> CostModel:
    frame, y, log2s = mixed_pairs(500, 0)
    model = CostModel(max_iter=60, min_samples_leaf=5).fit(frame, y, log2s)
    cal, ycal, _ = mixed_pairs(120, 1)
    model.calibrate(cal, ycal)
    return model


def test_portable_forecasts_equal_the_fitted_model_including_unseen_and_missing_values(fitted):
    portable = PortableCostModel.from_cost_model(fitted)
    frame, _, _ = mixed_pairs(300, 2)
    frame.loc[frame.index[::7], "c_algorithm"] = "never_seen"  # an unknown category: the missing way
    frame.loc[frame.index[::5], "a_n_regs"] = np.nan
    assert np.abs(portable.predict_log2(frame) - fitted.predict_log2(frame)).max() < 1e-9
    assert np.abs(portable.predict_proba(frame) - fitted.predict_proba(frame)).max() < 1e-9
    again = pickle.loads(pickle.dumps(portable))
    assert np.array_equal(again.predict_proba(frame), portable.predict_proba(frame))


def test_portable_equals_a_model_without_categorical_columns():
    frame, y, log2s = toy_pairs(200, 0)  # one family, numbers only: no column encoder
    model = CostModel(max_iter=30, min_samples_leaf=5).fit(frame, y, log2s)
    test, _, _ = toy_pairs(50, 3)
    assert np.abs(PortableCostModel.from_cost_model(model).predict_proba(test) - model.predict_proba(test)).max() < 1e-9


def test_predict_kernels_fills_known_compile_features(fitted):
    frame, _, _ = mixed_pairs(20, 4)
    cands = [dict(r, n_regs=None) for r in _records(frame, "c")]
    anchor = _records(frame, "a")[0]
    known = {c["kernel_id"]: {"n_regs": 128} for c in cands}
    portable = PortableCostModel.from_cost_model(fitted, features=known)
    filled = [dict(c, n_regs=128) for c in cands]
    expected = fitted.predict_proba(pair_frame([anchor] * len(filled), filled))
    assert np.abs(portable.predict_kernels(anchor, cands, "h200") - expected).max() < 1e-9


def _records(frame, side):
    cols = [c for c in frame.columns if c.startswith(f"{side}_")]
    return [dict({c[2:]: r[c] for c in cols}, task=r["task"]) for _, r in frame.iterrows()]


def test_unfitted_model_is_refused_in_one_line():
    with pytest.raises(ValueError, match="fitted cost model"):
        PortableCostModel.from_cost_model(CostModel())


def test_a_forecaster_file_loads_and_forecasts_without_scikit_learn_or_scipy(fitted, tmp_path):
    path = tmp_path / "forecaster.pkl"
    path.write_bytes(pickle.dumps(PortableCostModel.from_cost_model(fitted)))
    frame, _, _ = mixed_pairs(10, 5)
    expected = fitted.predict_proba(frame)
    frame_path = tmp_path / "frame.pkl"
    frame.to_pickle(frame_path)
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("sklearn", "scipy"):
                    raise ImportError("blocked " + name)
        sys.meta_path.insert(0, Block())
        import numpy as np, pandas as pd
        from pipelines.search.forecasters import load_forecaster_file
        f = load_forecaster_file({str(path)!r})
        np.save(sys.argv[1], f.predict_proba(pd.read_pickle({str(frame_path)!r})))
    """)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "p.npy")], check=True, timeout=120)
    assert np.abs(np.load(tmp_path / "p.npy") - expected).max() < 1e-9


def test_unknown_triton_candidates_are_compiled_once_for_their_features(fitted):
    from pipelines.forecasting.source_features import source_features_many

    portable = PortableCostModel.from_cost_model(fitted, compile_workers=1, compiler=source_features_many)
    seed = space.kernel_record("softmax", space.root_child("softmax"))
    assert portable.compile_missing([seed, space.reference_kernel("softmax")]) == 1  # the reference is not Triton
    feats = portable.features[seed["kernel_id"]]
    assert feats["n_regs"] and feats["n_regs"] > 0 and feats["n_launches"] >= 1
    assert portable.compile_missing([seed]) == 0  # remembered


def test_portable_forecasts_are_the_fitted_models_to_the_last_bit_and_survive_a_file_without_pickle(fitted, tmp_path):
    """Trees added in scikit-learn's order give its numbers exactly (a served model and the
    command that answers from the twin print the same digits); `save`/`load` keep them."""
    portable = PortableCostModel.from_cost_model(fitted)
    frame, _, _ = mixed_pairs(300, 5)
    frame.loc[frame.index[::5], "a_n_regs"] = np.nan
    assert np.array_equal(portable.predict_proba(frame), fitted.predict_proba(frame))
    path = portable.save(tmp_path / "model.npz")
    with np.load(path, allow_pickle=False) as z:  # arrays and text only
        assert {"head", "roots", "bitsets"} <= set(z.files)
    assert np.array_equal(PortableCostModel.load(path).predict_proba(frame), fitted.predict_proba(frame))
    (tmp_path / "bad.npz").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a saved portable cost model"):
        PortableCostModel.load(tmp_path / "bad.npz")
