"""Gradients of mixed-precision models: the backward follows the forward's precision, a float32
weight read through a Cast to float16 gets a float32 gradient, and forward values are reused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto

import amp_rewrite
from amp_rewrite.inputs import samples
from amp_rewrite.ir.types import typed_index
from amp_rewrite.training import gradient_model
from models import builders
from tests.gradcheck import ort_run, with_loss
from tests.helpers import model as text_model


def test_float32_weight_read_through_a_cast_gets_a_float32_gradient():
    m = text_model("""(float[4,3] x) => (float loss) {
        x16 = Cast<to=10>(x)
        w16 = Cast<to=10>(w)
        y16 = MatMul(x16, w16)
        t16 = Tanh(y16)
        y = Cast<to=1>(t16)
        loss = ReduceSum<keepdims=0>(y)
    }""", {"w": np.random.default_rng(0).normal(0, 0.5, (3, 2)).astype(np.float32)})
    grad = gradient_model(m, "loss", ["w"])
    onnx.checker.check_model(grad, full_check=True)
    out = next(o for o in grad.graph.output if o.name == "w_grad")
    assert out.type.tensor_type.elem_type == TensorProto.FLOAT
    x = np.random.default_rng(1).normal(0, 1, (4, 3)).astype(np.float32)
    got = ort_run(grad, {"x": x}, ["w_grad"])["w_grad"]
    assert got.dtype == np.float32
    w = onnx.numpy_helper.to_array(m.graph.initializer[0])
    expected = x.T @ (1 - np.tanh(x @ w) ** 2)
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-3)  # float16 forward and backward


def test_gradient_of_converted_model_follows_its_precision():
    original = builders.mlp()
    feeds = samples.generate(original, 1, None, 0)[0]
    original = with_loss(original, feeds)
    mixed, report = amp_rewrite.convert(original, range_check="off")
    assert report.low_nodes > 0
    grad = gradient_model(mixed, "loss")
    onnx.checker.check_model(grad, full_check=True)
    index = typed_index(grad)
    weights = {t.name: t.data_type for t in mixed.graph.initializer}
    grads = [o for o in grad.graph.output if o.name.endswith("_grad")]
    assert grads and all(o.type.tensor_type.elem_type == weights[o.name.removesuffix("_grad")] for o in grads)
    forward_matmul = {index.values[n.inputs[0]].elem_type for n in index.nodes
                      if n.op_type == "MatMul" and n.position < len(mixed.graph.node)}
    backward_matmul = {index.values[n.inputs[0]].elem_type for n in index.nodes
                       if n.op_type == "MatMul" and n.position >= len(mixed.graph.node)}
    assert forward_matmul == backward_matmul == {TensorProto.FLOAT16}
    # The mixed gradients agree with float32's to float16 accuracy.
    names = [o.name for o in grads]
    reference = ort_run(gradient_model(original, "loss"), feeds, names)
    observed = ort_run(grad, feeds, names)
    for name in names:
        want, got = reference[name].astype(np.float64), observed[name].astype(np.float64)
        assert np.linalg.norm(got - want) <= 2e-2 * np.linalg.norm(want), name


def test_forward_values_are_read_not_recomputed():
    m = text_model("""(float[2,3] x) => (float loss) {
        a = MatMul(x, w)
        b = Sigmoid(a)
        c = Tanh(b)
        d = Exp(c)
        e = Sqrt(d)
        loss = ReduceSum<keepdims=0>(e)
    }""", {"w": np.ones((3, 3), np.float32) * 0.1})
    forward = Counter(n.op_type for n in m.graph.node)
    grad = gradient_model(m, "loss", ["w"])
    after = Counter(n.op_type for n in grad.graph.node)
    for op in ("Sigmoid", "Tanh", "Exp", "Sqrt"):
        assert after[op] == forward[op], op
