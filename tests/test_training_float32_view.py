"""A model whose floats are float16, bfloat16 or float64 trains through its float32 view, and
the trained model is the input model with its new weights in their own type."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.cli import main
from amp_rewrite.errors import UserError
from amp_rewrite.training import build
from amp_rewrite.training.adapters.float32_view import lower
from amp_rewrite.training.runner.trainer import Trainer
from tests.gradcheck import ort_run
from tests.helpers import rng

NP = {TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT: np.float32}


def _mlp(elem: int) -> onnx.ModelProto:
    """x[N,4] (``elem``) -> MatMul(w1) + b1 -> Relu -> MatMul(w2, a Constant node) -> Cast(to=elem)
    -> y[N,2]: every float of type ``elem``, as a model exported in that precision holds them."""
    dtype = NP[elem]
    w1 = numpy_helper.from_array(rng(1).normal(0, 0.5, (4, 8)).astype(dtype), "w1")
    b1 = numpy_helper.from_array(np.zeros(8, dtype), "b1")
    nodes = [helper.make_node("Constant", [], ["w2"], name="w2_node",
                              value=numpy_helper.from_array(rng(2).normal(0, 0.5, (8, 2)).astype(dtype))),
             helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["z"], name="mm2"),
             helper.make_node("Cast", ["z"], ["y"], to=elem)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, ["N", 4])],
                              [helper.make_tensor_value_info("y", elem, ["N", 2])], [w1, b1],
                              value_info=[helper.make_tensor_value_info("h", elem, ["N", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _data(dtype, n: int = 64) -> dict[str, np.ndarray]:
    x = rng(3).normal(0, 1, (n, 4))
    return {"x": x.astype(dtype), "labels": np.stack([x[:, 0] - x[:, 1], x[:, 2]], 1).astype(dtype)}


def _types(model: onnx.ModelProto) -> set[int]:
    graph = model.graph
    return ({t.data_type for t in graph.initializer} | {a.t.data_type for n in graph.node for a in n.attribute
                                                         if a.type == onnx.AttributeProto.TENSOR}
            | {a.i for n in graph.node for a in n.attribute if n.op_type == "Cast"}
            | {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output, *graph.value_info)})


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.DOUBLE])
def test_the_view_holds_float32_only_and_computes_what_the_model_does(elem) -> None:
    model = _mlp(elem)
    view = onnx.ModelProto.FromString(model.SerializeToString())
    lower(view)
    onnx.checker.check_model(view, full_check=True)
    assert _types(view) == {TensorProto.FLOAT}
    assert [(n.name, n.op_type) for n in view.graph.node] == [(n.name, n.op_type) for n in model.graph.node]
    x = _data(NP[elem])["x"]
    expected = ort_run(model, {"x": x}, ["y"])["y"].astype(np.float64)
    got = ort_run(view, {"x": x.astype(np.float32)}, ["y"])["y"]
    assert np.allclose(got, expected, rtol=2e-3 if elem == TensorProto.FLOAT16 else 1e-6, atol=1e-3)


def test_a_view_does_not_turn_a_float64_beyond_float32_into_infinity() -> None:
    model = _mlp(TensorProto.DOUBLE)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.full(8, 1e300), "b1"))
    with pytest.raises(UserError, match="'b1' holds values beyond float32's range"):
        lower(model)


def test_a_float16_model_trains_as_its_float32_upcast_does() -> None:
    """The step of a float16 model is the step of the float32 model with the same (upcast) weights."""
    half = _mlp(TensorProto.FLOAT16)
    upcast = onnx.ModelProto.FromString(half.SerializeToString())
    lower(upcast)
    data = _data(np.float32)
    trained = []
    for model in (half, upcast):
        trainer = Trainer(build(model, loss="mse", output="y", precision="float32"), lr=0.05)
        trainer.fit(data, epochs=3, batch_size=16, progress=False)
        trained.append(trainer.weights)
    assert trained[0].keys() == trained[1].keys() == {"w1", "b1", "w2"}
    for name in trained[0]:
        assert np.array_equal(trained[0][name], trained[1][name])


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.DOUBLE])
@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_train_writes_the_new_weights_back_in_their_own_type(tmp_path, elem, precision) -> None:
    model = _mlp(elem)
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "t.onnx"
    onnx.save(model, path)
    feeds = _data(NP[elem])
    np.savez(data, **feeds)
    assert main(["train", str(path), "--data", str(data), "--loss", "mse", "--output", "y", "--epochs", "6",
                 "--lr", "0.01", "--precision", precision, "-o", str(out), "--quiet"]) == 0
    trained = onnx.load(out)
    assert onnx.load(path) == model  # the input is never modified
    assert [(n.name, n.op_type, list(n.input), list(n.output)) for n in trained.graph.node] == \
        [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    assert _types(trained) == {elem}
    assert not np.array_equal(numpy_helper.to_array(trained.graph.initializer[0]),
                              numpy_helper.to_array(model.graph.initializer[0]))

    def mse(m):
        y = ort_run(m, {"x": feeds["x"]}, ["y"])["y"].astype(np.float64)
        return np.mean((y - feeds["labels"]) ** 2)

    assert mse(trained) < mse(model)
