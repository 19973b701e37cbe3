"""A model whose shapes are computed at run time (a decoder's Resize to sizes taken from Shape,
as segmentation and detection exports are) is specialized to the training data's extents: its
shape computations fold to constants, its gradients are checked against finite differences, and
`train` does it by itself."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.autodiff.context import DynamicShapes
from amp_rewrite.cli import main
from amp_rewrite.ir.specialize import specialized
from amp_rewrite.training import build, gradient_model
from tests.gradcheck import directional_check, ort_run, with_loss
from tests.helpers import rng

WEIGHTS = ["w1", "w2"]


def _decoder(mode: str = "cubic") -> onnx.ModelProto:
    """x[N,3,H,W] -> Conv(stride 2) -> Resize to Concat(Shape(x)[:2] of the Conv, 2 x its Shape[2:]) ->
    Conv -> y[N,2,H,W]: the Resize's sizes are computed from the map's shape (a cubic Resize's
    gradient needs them static; a nearest or linear one's is built from the run-time extents)."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["lead"]),
        helper.make_node("Slice", ["shape", "two", "four"], ["spatial"]),
        helper.make_node("Mul", ["spatial", "two"], ["doubled"]),
        helper.make_node("Concat", ["lead", "doubled"], ["sizes"], axis=0),
        helper.make_node("Resize", ["c", "", "", "sizes"], ["up"], mode=mode),
        helper.make_node("Conv", ["up", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = [numpy_helper.from_array(rng(1).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng(2).normal(0, 0.3, (2, 4, 3, 3)).astype(np.float32), "w2"),
             *(numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("two", 2), ("four", 4)))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "H", "W"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _x(n: int = 2) -> np.ndarray:
    return rng(3).normal(0, 1, (n, 3, 8, 8)).astype(np.float32)


def test_shape_computations_fold_and_the_specialized_model_computes_the_same() -> None:
    model = _decoder()
    fixed = specialized(model, {"x": (2, 3, 8, 8)}, keep=set(WEIGHTS))
    assert [n.op_type for n in fixed.graph.node] == ["Conv", "Resize", "Conv"]
    sizes = next(t for t in fixed.graph.initializer if t.name == "sizes")
    assert numpy_helper.to_array(sizes).tolist() == [2, 4, 8, 8]
    assert np.allclose(ort_run(fixed, {"x": _x()}, ["y"])["y"], ort_run(model, {"x": _x()}, ["y"])["y"])
    kept = specialized(model, {"x": (2, 3, 8, 8)}, keep={"two"})  # a value to keep, and all that reads it
    assert "Mul" in [n.op_type for n in kept.graph.node]


def test_the_specialized_gradients_match_finite_differences() -> None:
    feeds = {"x": _x()}
    with pytest.raises(DynamicShapes, match="Resize"):
        gradient_model(with_loss(_decoder(), feeds), "loss", WEIGHTS)
    fixed = with_loss(specialized(_decoder(), {"x": (2, 3, 8, 8)}, keep=set(WEIGHTS)), feeds)
    directional_check(fixed, feeds, WEIGHTS)


def test_a_nearest_resize_to_a_computed_size_needs_no_specialization() -> None:
    feeds = {"x": _x()}
    directional_check(with_loss(_decoder("nearest"), feeds), feeds, WEIGHTS)


def test_train_specializes_the_step_to_its_data(tmp_path) -> None:
    """20 samples in batches of 8: the step takes [8, 3, 8, 8] alone, and the last 4 are left
    out of each epoch."""
    path = tmp_path / "m.onnx"
    onnx.save(_decoder(), path)
    x = rng(4).normal(0, 1, (20, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, labels=np.zeros((20, 2, 8, 8), np.float32))
    report = tmp_path / "r.json"
    for precision in ("float32", "float16"):
        assert main(["train", str(path), "--data", str(tmp_path / "d.npz"), "--loss", "mse", "--output", "y",
                     "--epochs", "3", "--lr", "1e-2", "--batch-size", "8", "--precision", precision, "-o",
                     str(tmp_path / "t.onnx"), "--report", str(report), "--quiet"]) == 0
        found = json.loads(report.read_text())
        assert found["spec"]["extents"] == {"x": [8, 3, 8, 8], "labels": [8, 2, 8, 8]}
        assert found["steps"] == 6 and found["epochs"][-1]["loss"] < found["epochs"][0]["loss"]
    trained = onnx.load(tmp_path / "t.onnx")
    assert [n.op_type for n in trained.graph.node] == [n.op_type for n in _decoder().graph.node]  # as given
    with pytest.raises(DynamicShapes, match="train specializes the step"):
        build(_decoder(), loss="mse", output="y")


def test_shapes_onnx_cannot_infer_are_taken_from_a_run(tmp_path) -> None:
    """scikit-learn's MLP: an ai.onnx.ml Scaler, which onnx's inference types but does not shape,
    then MatMuls whose ranks were unknown; specialized, the step declares what a run shows."""
    graph = helper.make_graph(
        [helper.make_node("Scaler", ["X"], ["scaled"], domain="ai.onnx.ml", offset=[0.5] * 4, scale=[2.0] * 4),
         helper.make_node("MatMul", ["scaled", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(rng(1).normal(0, 1, (4, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
                              ir_version=8)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "d.npz", X=rng(2).normal(0, 1, (16, 4)).astype(np.float32),
             labels=np.zeros((16, 3), np.float32))
    with pytest.raises(DynamicShapes, match="ranks of its inputs are unknown"):
        build(model, loss="mse", output="y")
    assert main(["train", str(path), "--data", str(tmp_path / "d.npz"), "--loss", "mse", "--output", "y", "--lr",
                 "1e-2", "--batch-size", "8", "--precision", "float32", "-o", str(tmp_path / "t.onnx"), "--quiet"]) == 0
