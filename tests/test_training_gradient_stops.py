"""A loss that reaches no trainable weight is refused in one line naming where the gradient stops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.training import build
from tests.helpers import rng


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_weights_reached_only_through_indices_name_the_op_that_made_them() -> None:
    """k-NN's shape: distances to stored points (float weights), TopK, the indices as the output."""
    model = _model([helper.make_node("MatMul", ["x", "points"], ["d"]),
                    helper.make_node("TopK", ["d", "k"], ["values", "indices"], name="nearest"),
                    helper.make_node("Cast", ["indices"], ["y"], to=TensorProto.FLOAT)],
                   [numpy_helper.from_array(rng(1).normal(0, 1, (4, 6)).astype(np.float32), "points"),
                    numpy_helper.from_array(np.array([2], np.int64), "k")])
    with pytest.raises(UserError) as raised:
        build(model, loss="mse", output="y", precision="float32")
    assert str(raised.value) == (
        "the loss 'loss' depends on no trainable weight: nothing to train (its float weights reach it only through "
        "TopK 'nearest', whose output 'indices' is int64: no gradient passes an integer or boolean value)")


def test_a_model_without_weights_says_so() -> None:
    model = _model([helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])],
                   [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in
                    (("starts", 0), ("ends", 2), ("axes", 1))])
    with pytest.raises(UserError, match=r"nothing to train \(no float weight lies on a differentiable path to it\)$"):
        build(model, loss="mse", output="y", precision="float32")
