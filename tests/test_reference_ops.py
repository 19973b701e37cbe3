"""The reference evaluator the numerics tests use agrees with ONNX Runtime (float32) on the
ops that onnx's own evaluator gets wrong (``tests/reference_ops.py``), where onnx's does not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from amp_rewrite.runtime import instrument
from tests.helpers import model
from tests.reference_ops import evaluator

RNG = np.random.default_rng(0)
X = (RNG.normal(size=(2, 6, 3, 4)) * 4).astype(np.float32)
STATS = {"s": RNG.uniform(0.5, 2, 6).astype(np.float32), "b": RNG.normal(size=6).astype(np.float32),
         "m": RNG.normal(size=6).astype(np.float32), "v": RNG.uniform(0.5, 2, 6).astype(np.float32)}

CASES = {
    "lrn": (9, "y = LRN <size = 3, alpha = 0.01, beta = 0.75, bias = 1.0> (x)", {}),
    "batch_norm_9": (9, "y = BatchNormalization <epsilon = 0.001> (x, s, b, m, v)", STATS),
    "batch_norm_7_per_element": (7, "y = BatchNormalization <spatial = 0> (x, s, b, m, v)",
                                 {k: np.broadcast_to(a[:, None, None], (6, 3, 4)).copy() for k, a in STATS.items()}),
    "softmax_11_default_axis": (11, "y = Softmax (x)", {}),
    "softmax_11_axis_2": (11, "y = Softmax <axis = 2> (x)", {}),
    "log_softmax_11_axis_-2": (11, "y = LogSoftmax <axis = -2> (x)", {}),
    "hardmax_11_default_axis": (11, "y = Hardmax (x)", {}),
}


def _case(name: str) -> tuple[onnx.ModelProto, dict]:
    opset, body, weights = CASES[name]
    m = model(f"(float[2,6,3,4] x) => (float[2,6,3,4] y) {{ {body} }}", weights, opset=opset)
    return m, {"x": X}


@pytest.mark.parametrize("name", CASES)
def test_corrected_ops_agree_with_onnxruntime(name: str) -> None:
    m, feeds = _case(name)
    want = instrument.run(instrument.session(m), feeds)["y"]
    np.testing.assert_allclose(evaluator(m).run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lrn", "batch_norm_9", "softmax_11_default_axis", "hardmax_11_default_axis"])
def test_onnx_evaluator_gets_these_wrong(name: str) -> None:
    """What the corrections are for: should onnx fix its evaluator, this fails and they can go."""
    m, feeds = _case(name)
    want = instrument.run(instrument.session(m), feeds)["y"]
    assert np.abs(ReferenceEvaluator(m).run(None, feeds)[0] - want).max() > 1e-2


def test_opset_13_softmax_is_onnx_s_own() -> None:
    m = model("(float[2,6,3,4] x) => (float[2,6,3,4] y) { y = Softmax <axis = 1> (x) }", opset=13)
    np.testing.assert_array_equal(evaluator(m).run(None, {"x": X})[0], ReferenceEvaluator(m).run(None, {"x": X})[0])
