"""Every gradient rule against central finite differences in float64 (cases in ``tests/gradcases``).

Each case's gradient graph must pass the full ONNX checker, match finite
differences run by ONNX's reference evaluator in float64, and (float32) run on
ONNX Runtime's CPU provider with the same result.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gradcases import CASES, Case
from tests.gradcheck import analytic, assert_close, case_model, numeric


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_rule_matches_finite_differences(case: Case):
    model, wrt = case_model(case)
    assert wrt, "a case differentiates at least one input"
    want = numeric(model, wrt, case.eps)
    got = analytic(model, wrt)
    assert_close(got, want, case.rtol, case.atol, f"{case.name} (reference, float64)")
    if case.ort:
        model32, _ = case_model(case, np.float32)
        assert_close(analytic(model32, wrt, runner="ort"), want, 2e-3, 1e-4, f"{case.name} (ONNX Runtime, float32)")


@pytest.mark.parametrize("activation, attrs", [("Relu", {}), ("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 1.0})])
def test_activations_differentiated_from_their_output_leave_the_conv_output_one_reader(activation, attrs):
    """The backward reads the activation's output, not its input: the Conv's output has the
    activation as its only reader, so it is freed after the forward and Conv+activation can fuse."""
    from onnx import TensorProto, helper, numpy_helper

    from amp_rewrite.training import gradient_model

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node(activation, ["c"], ["a"], **attrs),
         helper.make_node("ReduceSum", ["a"], ["loss"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    grad = gradient_model(model, "loss", ["w"])
    assert [n.op_type for n in grad.graph.node if "c" in n.input] == [activation]
