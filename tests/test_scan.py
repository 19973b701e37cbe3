"""Scan unrolled into copies of its body computes what ONNX Runtime's Scan computes (scan input
and output directions and axes, states, the body's own constants and outer values); its
gradients match finite differences of the Scan model itself."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.autodiff.context import DynamicShapes
from amp_rewrite.autodiff.lowerings.recurrent import unrolled
from tests.gradcheck import directional_check, ort_run, with_loss
from tests.helpers import rng

T, N, F, H = 4, 3, 5, 6


def _scan(in_dirs=(0, 0), out_dir=0, out_axis=0, steps=T) -> onnx.ModelProto:
    """s[N,H] carried; scan inputs x[T,N,F] (axis 0) and u[N,T,H] (axis 1); body:
    s' = tanh(s + x_t W) * 0.5 + u_t, y_t = s' * s'; outputs the final s and the stacked y."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "W"], ["xw"]), helper.make_node("Add", ["s", "xw"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["act"]), helper.make_node("Mul", ["act", "half"], ["scaled"]),
         helper.make_node("Add", ["scaled", "u_t"], ["s_next"]),
         helper.make_node("Mul", ["s_next", "s_next"], ["y_t"])],
        "body", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                 (("s", [N, H]), ("x_t", [N, F]), ("u_t", [N, H]))],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [N, H]) for n in ("s_next", "y_t")],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    node = helper.make_node("Scan", ["s0", "x", "u"], ["s_final", "ys"], name="scan", body=body, num_scan_inputs=2,
                            scan_input_directions=list(in_dirs), scan_input_axes=[0, 1],
                            scan_output_directions=[out_dir], scan_output_axes=[out_axis])
    stacked = [N, H]
    stacked.insert(out_axis % 3, steps)
    inits = [numpy_helper.from_array(rng(1).normal(0, 0.5, (F, H)).astype(np.float32), "W"),
             numpy_helper.from_array(rng(2).normal(0, 0.5, (N, H)).astype(np.float32), "s0")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, N, F]),
                                            helper.make_tensor_value_info("u", TensorProto.FLOAT, [N, steps, H])],
                              [helper.make_tensor_value_info("s_final", TensorProto.FLOAT, [N, H]),
                               helper.make_tensor_value_info("ys", TensorProto.FLOAT, stacked)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds() -> dict[str, np.ndarray]:
    return {"x": rng(3).normal(0, 1, (T, N, F)).astype(np.float32),
            "u": rng(4).normal(0, 0.3, (N, T, H)).astype(np.float32)}


CASES = [((0, 0), 0, 0), ((1, 0), 0, 0), ((0, 1), 1, 1), ((1, 1), 1, -1)]


@pytest.mark.parametrize("in_dirs, out_dir, out_axis", CASES)
def test_the_unrolled_scan_computes_what_onnxruntime_computes(in_dirs, out_dir, out_axis) -> None:
    model = _scan(in_dirs, out_dir, out_axis)
    want = ort_run(model, _feeds(), ["s_final", "ys"])
    flat = onnx.ModelProto.FromString(model.SerializeToString())
    assert unrolled(flat) == ["scan"] and "Scan" not in {n.op_type for n in flat.graph.node}
    onnx.checker.check_model(flat)
    got = ort_run(flat, _feeds(), ["s_final", "ys"])
    for name in want:
        assert got[name].shape == want[name].shape and np.allclose(got[name], want[name], atol=1e-6), name


@pytest.mark.parametrize("in_dirs, out_dir, out_axis", CASES[:2] + CASES[3:])
def test_the_scan_gradients_match_finite_differences(in_dirs, out_dir, out_axis) -> None:
    model = _scan(in_dirs, out_dir, out_axis)
    del model.graph.output[0]  # the loss reads the stacked outputs; the final state flows into them
    directional_check(with_loss(model, _feeds()), _feeds(), ["W", "s0"])


def test_a_scan_of_unknown_length_asks_for_specialization() -> None:
    with pytest.raises(DynamicShapes, match="its scan length is not static"):
        unrolled(_scan(steps="T"))
