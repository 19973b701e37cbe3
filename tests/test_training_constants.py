"""Weights held in Constant nodes (as paddle2onnx and tf2onnx write them) train as initializers
do, and the trained model is the input model, same nodes and names, with new weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.cli import main
from amp_rewrite.training import build
from amp_rewrite.training.runner.trainer import Trainer
from tests.gradcheck import ort_run
from tests.helpers import rng


def _constant_mlp() -> onnx.ModelProto:
    """x[N,4] -> MatMul(w1) + b1 -> Relu -> MatMul(w2) -> logits, every weight a Constant node; a
    scalar Constant (a gain) and an int64 shape Constant stay what they are."""
    def constant(name, array):
        return helper.make_node("Constant", [], [name], name=f"{name}_node", value=numpy_helper.from_array(array))

    nodes = [constant("w1", rng(1).normal(0, 0.5, (4, 8)).astype(np.float32)),
             constant("b1", np.zeros(8, np.float32)),
             constant("w2", rng(2).normal(0, 0.5, (8, 3)).astype(np.float32)),
             constant("gain", np.array(1.0, np.float32)), constant("shape", np.array([-1, 3], np.int64)),
             helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"]),
             helper.make_node("Mul", ["z", "gain"], ["g"]), helper.make_node("Reshape", ["g", "shape"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _data(n: int = 64) -> dict[str, np.ndarray]:
    x = rng(3).normal(0, 1, (n, 4)).astype(np.float32)
    return {"x": x, "labels": (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)}


def test_constant_node_weights_are_the_parameters() -> None:
    for precision in ("float32", "float16"):
        step = build(_constant_mlp(), loss="cross-entropy", output="logits", precision=precision)
        assert sorted(p.input for p in step.spec.params) == ["b1", "w1", "w2"]


def test_trained_weights_go_back_into_their_constant_nodes(tmp_path) -> None:
    model = _constant_mlp()
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "t.onnx"
    onnx.save(model, path)
    np.savez(data, **_data())
    assert main(["train", str(path), "--data", str(data), "--loss", "cross-entropy", "--output", "logits",
                 "--epochs", "5", "--lr", "0.05", "-o", str(out), "--quiet"]) == 0
    trained = onnx.load(out)
    assert [(n.name, n.op_type, list(n.input), list(n.output)) for n in trained.graph.node] == \
        [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    assert not trained.graph.initializer
    values, before = ({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in m.graph.node
                       if n.op_type == "Constant"} for m in (trained, model))
    assert {k for k in values if not np.array_equal(values[k], before[k])} == {"w1", "b1", "w2"}
    feeds = _data()

    def loss(m):
        logits = ort_run(m, {"x": feeds["x"]}, ["logits"])["logits"].astype(np.float64)
        logits -= logits.max(1, keepdims=True)
        return -np.mean(logits[np.arange(len(logits)), feeds["labels"]] - np.log(np.exp(logits).sum(1)))

    assert loss(trained) < loss(model)


def test_the_forward_with_lifted_weights_computes_what_the_model_computes() -> None:
    model = _constant_mlp()
    step = build(model, loss="cross-entropy", output="logits", precision="float32")
    trainer = Trainer(step)
    x = _data()["x"]
    assert np.allclose(ort_run(trainer.with_weights(step.forward), {"x": x, "labels": _data()["labels"]},
                               ["logits"])["logits"], ort_run(model, {"x": x}, ["logits"])["logits"], atol=1e-6)


def test_batchnorm_statistics_shared_through_identity_nodes_train_apart_and_are_exported() -> None:
    """TorchScript writes equal fresh statistics once and gives each BatchNormalization an Identity
    of it: each BN's running statistics train on their own and go back as Constant nodes of the
    Identity's name and output (they were refused: "not initializers")."""
    c = 3
    inits = [numpy_helper.from_array(np.zeros(c, np.float32), "zeros"), numpy_helper.from_array(np.ones(c, np.float32),
                                                                                                 "ones"),
             numpy_helper.from_array(rng(5).normal(0, 0.5, (c, c, 1, 1)).astype(np.float32), "w")]
    nodes = []
    for i in range(2):
        nodes += [helper.make_node("Identity", ["zeros"], [f"mean{i}"], name=f"mean{i}_node"),
                  helper.make_node("Identity", ["ones"], [f"var{i}"], name=f"var{i}_node")]
    nodes += [helper.make_node("BatchNormalization", ["x", "ones", "zeros", "mean0", "var0"], ["n0"], name="bn0"),
              helper.make_node("Conv", ["n0", "w"], ["h"]),
              helper.make_node("BatchNormalization", ["h", "ones", "zeros", "mean1", "var1"], ["y"], name="bn1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    step = build(model, loss="mse", output="y", precision="float32")
    stats = {p.input for p in step.spec.carried if p.role in ("running_mean", "running_var")}
    assert stats == {"mean0", "var0", "mean1", "var1"}
    trainer = Trainer(step, lr=0.01)
    x = rng(6).normal(2.0, 3.0, (16, c, 4, 4)).astype(np.float32)
    trainer.fit({"x": x, "labels": np.zeros_like(x)}, epochs=2, batch_size=8, progress=False)
    exported = trainer.with_weights(step.original)
    made = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in exported.graph.node
            if n.op_type == "Constant"}
    assert set(made) == stats and not np.allclose(made["mean0"], made["mean1"])
    assert all(np.allclose(made[name], trainer.value(name)) for name in stats)
    assert [n.name for n in exported.graph.node] == [n.name for n in model.graph.node]


def test_weights_made_by_constant_of_shape_train_and_go_back_as_constant_nodes(tmp_path) -> None:
    """onnx's light models make every weight and BatchNormalization statistic with ConstantOfShape
    of an initializer shape (IR 3: the shapes are inputs too): they train and are exported as
    Constant nodes of the same names and outputs; a ConstantOfShape of a run-time shape stays."""
    c = 3

    def filled(name, dims, value, shape_input=None):
        return helper.make_node("ConstantOfShape", [shape_input or f"{name}__SHAPE"], [name], name=f"{name}_node",
                                value=numpy_helper.from_array(np.array([value], np.float32)))

    dims = {"w": [c, c, 1, 1], "scale": [c], "bias": [c], "mean": [c], "var": [c]}
    shapes = [numpy_helper.from_array(np.array(d, np.int64), f"{k}__SHAPE") for k, d in dims.items()]
    nodes = [filled(k, d, v) for (k, d), v in zip(dims.items(), (0.3, 1.0, 0.0, 0.0, 1.0))]
    nodes += [helper.make_node("Shape", ["x"], ["xs"]), filled("zeros", None, 0.0, "xs"),
              helper.make_node("Conv", ["x", "w"], ["h"]),
              helper.make_node("BatchNormalization", ["h", "scale", "bias", "mean", "var"], ["n"], name="bn"),
              helper.make_node("Add", ["n", "zeros"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 4, 4])]
    inputs += [helper.make_tensor_value_info(t.name, TensorProto.INT64, list(t.dims)) for t in shapes]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                  ["N", c, 4, 4])], shapes)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
    step = build(model, loss="mse", output="y", precision="float32")
    assert sorted(p.input for p in step.spec.params) == ["bias", "scale", "w"]
    assert {p.input for p in step.spec.carried if p.role in ("running_mean", "running_var")} == {"mean", "var"}
    trainer = Trainer(step, lr=0.05)
    x = rng(7).normal(0, 1, (16, c, 4, 4)).astype(np.float32)
    labels = 2.0 * x + 0.5
    epochs = trainer.fit({"x": x, "labels": labels}, epochs=4, batch_size=8, progress=False).epochs
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    exported = trainer.with_weights(step.original)
    assert [(n.name, list(n.output)) for n in exported.graph.node] == [(n.name, list(n.output)) for n in nodes]
    made = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in exported.graph.node
            if n.op_type == "Constant"}
    assert set(made) == set(dims) and all(np.allclose(made[k], trainer.value(k)) for k in dims)
    assert made["w"].shape == tuple(dims["w"]) and not np.allclose(made["w"], 0.3)
    assert [n.op_type for n in exported.graph.node if n.name == "zeros_node"] == ["ConstantOfShape"]
    out = ort_run(exported, {"x": x}, ["y"])["y"]
    assert np.mean((out - labels) ** 2) < np.mean((ort_run(model, {"x": x}, ["y"])["y"] - labels) ** 2)


def test_a_state_made_at_run_time_is_no_parameter_of_a_specialized_step() -> None:
    """A zero state shaped by the batch (``ConstantOfShape(Concat(Shape(x)[0], 3))``, as a
    recurrent layer's initial state is exported) folds to a constant when the step is
    specialized: it is not trained, and the exported model still makes it at run time."""
    w = numpy_helper.from_array(rng(8).normal(0, 0.5, (4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Shape", ["x"], ["xs"], end=1),
             helper.make_node("Concat", ["xs", "three"], ["dims"], axis=0),
             helper.make_node("ConstantOfShape", ["dims"], ["state"], name="state_node",
                              value=numpy_helper.from_array(np.zeros(1, np.float32))),
             helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "state"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [w, numpy_helper.from_array(np.array([3], np.int64), "three")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    step = build(model, loss="mse", output="y", precision="float32", specialize={"x": [8, 4]})
    assert [p.input for p in step.spec.params] == ["w"]
    trainer = Trainer(step, lr=0.05)
    x = rng(9).normal(0, 1, (16, 4)).astype(np.float32)
    trainer.fit({"x": x, "labels": x[:, :3] + 1.0}, epochs=2, batch_size=8, progress=False)
    exported = trainer.with_weights(step.original)
    assert [n.op_type for n in exported.graph.node] == [n.op_type for n in nodes]
    assert ort_run(exported, {"x": x[:5]}, ["y"])["y"].shape == (5, 3)


def test_an_export_whose_weights_did_not_go_back_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    """train checks the written model against the trained forward on the data's first samples: a
    write-back that missed the Constant nodes is one line, exit 2, no file."""
    from amp_rewrite.training.adapters import constant_weights

    model = _constant_mlp()
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "t.onnx"
    onnx.save(model, path)
    np.savez(data, **_data())
    monkeypatch.setattr(constant_weights, "write_back", lambda model, weights: None)
    assert main(["train", str(path), "--data", str(data), "--loss", "cross-entropy", "--output", "logits",
                 "--epochs", "3", "--lr", "0.05", "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the exported model's output 'logits' differs from the trained step's" in err, err
    assert not out.exists()
