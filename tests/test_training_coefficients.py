"""One-element constants of a model's formulas (epsilons, scales, fill values) are not trained by
default; one-element weights (a bias of one output, CLIP's logit scale) are."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir import io
from amp_rewrite.training import build
from amp_rewrite.training.graph.coefficients import coefficients
from amp_rewrite.training.runner.trainer import Trainer
from tests.helpers import rng


def _scorer() -> onnx.ModelProto:
    """x[N,4] -> MatMul(w) + bias[1] -> y; y * 0.5 / sqrt(mean(y^2) + eps) * exp(logit_scale) ->
    score[N,1]; a mask fill of -3.4e38 selected where y is below zero before the exp of logit_scale:
    every scalar as the dynamo exporter writes it, an initializer of its own."""
    r = rng(1)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w", r.normal(0, 0.5, (4, 1)).astype(np.float32)), ("bias", np.array([0.1], np.float32)),
        ("half", np.array(0.5, np.float32)), ("eps", np.array([1e-6], np.float32)),
        ("logit_scale", np.array(0.3, np.float32)), ("fill", np.array(-3.4e38, np.float32)),
        ("zero", np.array(0.0, np.float32)))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["y"]),
             helper.make_node("Mul", ["y", "half"], ["a"]),
             helper.make_node("Mul", ["y", "y"], ["yy"]), helper.make_node("ReduceMean", ["yy"], ["m2"], keepdims=1),
             helper.make_node("Add", ["m2", "eps"], ["v"]), helper.make_node("Sqrt", ["v"], ["s"]),
             helper.make_node("Div", ["a", "s"], ["n"]), helper.make_node("Exp", ["logit_scale"], ["k"]),
             helper.make_node("Less", ["y", "zero"], ["neg"]), helper.make_node("Where", ["neg", "fill", "n"], ["f"]),
             helper.make_node("Max", ["f", "zero"], ["c"]), helper.make_node("Mul", ["c", "k"], ["score"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_formula_scalars_are_coefficients_and_weights_of_one_element_are_not() -> None:
    assert coefficients(_scorer()) == {"half", "eps", "fill", "zero"}


def test_train_leaves_coefficients_as_they_are_and_trains_the_weights(tmp_path) -> None:
    step = build(_scorer(), loss="mse", output="score", precision="float32")
    assert {c.input for c in step.spec.params} == {"w", "bias", "logit_scale"}
    trainer = Trainer(step, lr=1e-2)
    x = rng(2).normal(0, 1, (16, 4)).astype(np.float32)
    batch = {"x": x, "labels": np.abs(x[:, :1]).astype(np.float32)}
    for _ in range(3):
        trainer.step(batch)
    io.save(trainer.exported(), tmp_path / "trained.onnx", None)
    trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "trained.onnx").graph.initializer}
    assert trained["eps"] == np.float32(1e-6) and trained["half"] == np.float32(0.5)
    assert trained["logit_scale"] != np.float32(0.3) and trained["bias"][0] != np.float32(0.1)


def test_param_names_a_coefficient_and_a_loss_reaching_only_coefficients_is_refused() -> None:
    named = build(_scorer(), loss="mse", output="score", precision="float32", params=["w", "half"])
    assert [c.input for c in named.spec.params] == ["w", "half"]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array([1e-6], np.float32), "eps")]
    nodes = [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Add", ["h", "eps"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UserError, match="reaches only running statistics and constants of its formulas"):
        build(model, loss="mse", output="y", precision="float32")


def _group_norm(scale: np.ndarray, spelled: bool = True) -> onnx.ModelProto:
    """x[N,4,3,3] -> GroupNormalization(2 groups) as PyTorch's exporters spell it before opset 18
    (Reshape -> InstanceNormalization(scale, zeros) -> Reshape -> Mul(gamma) -> Add(beta)) -> Conv(w)
    -> y; not ``spelled``: an InstanceNormalization of the activation itself (its own layer)."""
    r = rng(3)
    channels = 2 if spelled else 4
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("scale", scale[:channels]), ("zeros", np.zeros(channels)), ("gamma", r.normal(1, 0.1, (4, 1, 1))),
        ("beta", r.normal(0, 0.1, (4, 1, 1))), ("w", r.normal(0, 0.3, (4, 4, 1, 1))))]
    inits += [numpy_helper.from_array(np.array(s, np.int64), n) for n, s in (("grouped", [0, 2, -1]),
                                                                             ("back", [0, 4, 3, 3]))]
    norm = [helper.make_node("Reshape", ["x", "grouped"], ["g"]),
            helper.make_node("InstanceNormalization", ["g", "scale", "zeros"], ["gn"]),
            helper.make_node("Reshape", ["gn", "back"], ["n"])] if spelled else \
        [helper.make_node("InstanceNormalization", ["x", "scale", "zeros"], ["n"])]
    nodes = [*norm, helper.make_node("Mul", ["n", "gamma"], ["a"]), helper.make_node("Add", ["a", "beta"], ["b"]),
             helper.make_node("Conv", ["b", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 3, 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("scale, spelled, trained", [
    (np.ones(4), True, {"gamma", "beta", "w"}),  # the spelling's identity affine: constants
    (np.array([1.2, 0.8, 1.0, 1.0]), True, {"scale", "gamma", "beta", "w"}),  # a trained scale: a weight
    (np.ones(4), False, {"scale", "zeros", "gamma", "beta", "w"}),  # an InstanceNormalization layer's affine
])
def test_group_normalization_spelled_out_keeps_its_identity_affine(scale, spelled, trained) -> None:
    step = build(_group_norm(scale, spelled), loss="mse", output="y", precision="float32")
    assert {c.input for c in step.spec.params} == trained


def test_train_and_train_graph_say_how_many_tensors_they_hold(tmp_path, capsys) -> None:
    from amp_rewrite.cli import main

    path, data = tmp_path / "scorer.onnx", tmp_path / "data.npz"
    onnx.save(_scorer(), path)
    x = rng(4).normal(0, 1, (8, 4)).astype(np.float32)
    np.savez(data, x=x, labels=np.abs(x[:, :1]))
    assert main(["train", str(path), "--data", str(data), "--loss", "mse", "--output", "score", "--epochs", "1",
                 "--precision", "float32", "-o", str(tmp_path / "trained.onnx")]) == 0
    assert "training 3 parameters; 4 tensors the loss reads stay as they are" in capsys.readouterr().err
    assert main(["train-graph", str(path), "--loss", "mse", "--output", "score", "--precision", "float32",
                 "-o", str(tmp_path / "step.onnx")]) == 0
    assert "3 parameters (4 tensors the loss reads held as they are)" in capsys.readouterr().out
