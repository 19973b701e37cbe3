"""Gradient rules of ``amp_rewrite/autodiff/rules/norm.py`` that the finite-difference table cannot check.

Training-mode Dropout draws its mask at random, so its gradient is checked against the
mask ONNX Runtime returned in the same run. Softmax at opset 12 (coerced to 2-D) is
checked below the gradient models' opset 16, where ``gradient_model`` would upgrade it.
GroupNormalization-18 (scale per group) is deprecated in ONNX's checker, which the
table's harness runs. And every op the rules emit must have a CUDA kernel in float16
and bfloat16.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from amp_rewrite.autodiff import add_backward
from amp_rewrite.policy.kernels import kernel_table
from amp_rewrite.training import gradient_model
from tests.gradcases import CASES, Case, normal, positive
from tests.gradcheck import assert_close, case_model, numeric

RATIO = 0.3


def _ort_run(model: onnx.ModelProto, feeds: dict | None = None, outputs: list[str] | None = None) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = outputs or [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds or {})))


def _dropout_model(mask_output: bool, mode_input: bool = False, ratio_input: bool = False) -> onnx.ModelProto:
    """``loss = sum(Dropout(x, ratio, training_mode) * R)``; y (and the mask) are outputs too."""
    x, weight = normal(8, 10).astype(np.float32) + 5.0, normal(8, 10, seed=9).astype(np.float32)
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(weight, "R")]
    inputs = []
    if ratio_input:
        inputs.append(helper.make_tensor_value_info("ratio", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(np.array(RATIO, np.float32), "ratio"))
    if mode_input:
        inputs.append(helper.make_tensor_value_info("training_mode", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(True), "training_mode"))
    outs = ["y", "mask"] if mask_output else ["y"]
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training_mode"], outs, name="drop"),
             helper.make_node("Mul", ["y", "R"], ["weighted"]),
             helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    graph_outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
                     helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 10])]
    if mask_output:
        graph_outputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [8, 10]))
    graph = helper.make_graph(nodes, "dropout", inputs, graph_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weight(model: onnx.ModelProto) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "R")


def test_training_dropout_gradient_is_go_times_the_mask_ort_drew():
    model = _dropout_model(mask_output=True)
    grad = gradient_model(model, "loss", ["x"])
    onnx.checker.check_model(grad, full_check=True)
    got = _ort_run(grad)
    mask = got["mask"]
    assert 0 < mask.sum() < mask.size, "the draw should drop some elements and keep others"
    np.testing.assert_allclose(got["x_grad"], _weight(model) * mask / (1 - RATIO), rtol=1e-6)


def test_training_dropout_without_a_mask_output_gets_one():
    """The rule adds a mask output to the forward node; the kept elements are where y != 0 (x > 0)."""
    model = _dropout_model(mask_output=False)
    grad = gradient_model(model, "loss", ["x"])
    onnx.checker.check_model(grad, full_check=True)
    dropout = next(n for n in grad.graph.node if n.op_type == "Dropout")
    assert len(dropout.output) == 2 and dropout.output[1]
    got = _ort_run(grad)
    kept = got["y"] != 0
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(got["x_grad"], _weight(model) * kept / (1 - RATIO), rtol=1e-6)
    assert len(model.graph.node[0].output) == 1, "the caller's model is not modified"


@pytest.mark.parametrize("training", [True, False])
def test_dropout_with_training_mode_and_ratio_known_at_run_time(training: bool):
    model = _dropout_model(mask_output=True, mode_input=True, ratio_input=True)
    grad = gradient_model(model, "loss", ["x"])
    onnx.checker.check_model(grad, full_check=True)
    got = _ort_run(grad, {"training_mode": np.array(training), "ratio": np.array(RATIO, np.float32)})
    want = _weight(model) * got["mask"] / (1 - RATIO) if training else _weight(model)
    if training:
        assert 0 < got["mask"].sum() < got["mask"].size
    np.testing.assert_allclose(got["x_grad"], want, rtol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [1, -2])
def test_softmax_before_opset_13_normalises_the_input_coerced_to_2d(op: str, axis: int):
    """At opset 12 the input is coerced to 2-D at ``axis``: the sums run over every axis from
    it on. ONNX's reference evaluator applies opset 13's semantics at every opset, so the
    finite differences run a numpy forward and the gradient graph runs on ONNX Runtime."""
    x = normal(2, 3, 4)
    case = Case(op, {"x": x}, {"axis": axis}, opset=12)
    model, wrt = case_model(case, np.float32)
    weight = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "R0").astype(np.float64)

    def loss(x: np.ndarray) -> float:
        rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
        log_prob = rows - rows.max(1, keepdims=True)
        log_prob = log_prob - np.log(np.exp(log_prob).sum(1, keepdims=True))
        y = log_prob if op == "LogSoftmax" else np.exp(log_prob)
        return float((y.reshape(x.shape) * weight).sum())

    want = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = 1e-6
        want[i] = (loss(x + step) - loss(x - step)) / 2e-6
    backprop = add_backward(model, "loss", wrt)  # no upgrade: the rule runs at opset 12
    model.graph.node.extend(backprop.builder.nodes)
    model.graph.output.append(helper.make_tensor_value_info(backprop.grads["x"], TensorProto.FLOAT, [2, 3, 4]))
    onnx.checker.check_model(model, full_check=True)
    got = _ort_run(model, outputs=[backprop.grads["x"]])[backprop.grads["x"]]
    assert_close({"x_grad": got}, {"x_grad": want}, 2e-3, 1e-4, f"{op} opset 12 axis {axis}")


def test_group_normalization_18_scales_per_group():
    """Opset 18's scale and bias have one entry per group (opset 21 made them per channel).
    ONNX's checker rejects GroupNormalization-18 as deprecated; the reference evaluator and
    ONNX Runtime still run it, so the graph is checked without the full checker."""
    case = Case("GroupNormalization", {"x": normal(2, 6, 2, 2), "scale": positive(3), "B": normal(3, seed=1)},
                {"num_groups": 3, "epsilon": 1e-3}, opset=18)
    model, wrt = case_model(case)
    want = numeric(model, wrt)
    grad = gradient_model(model, "loss", wrt)
    names = [f"{w}_grad" for w in wrt]
    assert_close(dict(zip(names, ReferenceEvaluator(grad).run(names, {}))), want, 1e-5, 1e-7, "reference")
    model32, _ = case_model(case, np.float32)
    assert_close(_ort_run(gradient_model(model32, "loss", wrt), outputs=names), want, 2e-3, 1e-4, "ONNX Runtime")


def _loss_reading(op: str, inputs: dict, output: int, n_outputs: int, attrs: dict, opset: int) -> onnx.ModelProto:
    """``loss = ReduceSum(op(...)[output])``."""
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inputs.items()]
    outs = [f"out{i}" for i in range(n_outputs)]
    nodes = [helper.make_node(op, list(inputs), outs, **attrs),
             helper.make_node("ReduceSum", [outs[output]], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_batch_normalization_running_statistics_are_buffers():
    """A loss that reads only the running mean gets no gradient through it (PyTorch's buffers)."""
    inputs = {"x": normal(4, 3), "scale": positive(3), "B": normal(3), "mean": normal(3), "var": positive(3)}
    model = _loss_reading("BatchNormalization", inputs, 1, 3, {"training_mode": 1}, 15)
    grad = gradient_model(model, "loss", ["x", "scale"])
    got = _ort_run(grad, outputs=["x_grad", "scale_grad"])
    assert not got["x_grad"].any() and not got["scale_grad"].any()


@pytest.mark.parametrize("training", [0, 1])
def test_batch_normalization_with_float32_parameters_over_float16_input(training: int):
    """BatchNormalization-15 lets scale, B and the statistics have their own type: each gradient
    comes back in its input's type (float64 formulas, float16 tolerance)."""
    rng = np.random.default_rng(0)
    x, weight = (rng.normal(size=(4, 3, 2)).astype(np.float16).astype(np.float64) for _ in range(2))
    params = {"scale": positive(3), "B": normal(3), "mean": normal(3, seed=1), "var": positive(3, seed=2)}
    params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}
    inits = [numpy_helper.from_array(v.astype(np.float16), k) for k, v in (("x", x), ("R", weight))]
    inits += [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()]
    outs = ["y", "running_mean", "running_var"] if training else ["y"]
    nodes = [helper.make_node("BatchNormalization", ["x", *params], outs, training_mode=training),
             helper.make_node("Mul", ["y", "R"], ["terms"]),
             helper.make_node("ReduceSum", ["terms"], ["loss16"], keepdims=0),
             helper.make_node("Cast", ["loss16"], ["loss"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bn", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    grad = gradient_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8),
                          "loss", ["x", "scale", "B"])
    onnx.checker.check_model(grad, full_check=True)
    got = dict(zip(["x", "scale", "B"], ReferenceEvaluator(grad).run(["x_grad", "scale_grad", "B_grad"], {})))
    assert [got[k].dtype for k in got] == [np.float16, np.float32, np.float32]
    axes = (0, 2)

    def per_channel(v: np.ndarray) -> np.ndarray:
        return v[:, None]

    mean, var = (x.mean(axes), x.var(axes)) if training else (params["mean"], params["var"])
    inv_std = per_channel(1 / np.sqrt(var + 1e-5))
    x_hat = (x - per_channel(mean)) * inv_std
    g_hat = weight * per_channel(params["scale"])
    dx = (inv_std * (g_hat - g_hat.mean(axes, keepdims=True) - x_hat * (g_hat * x_hat).mean(axes, keepdims=True))
          if training else g_hat * inv_std)
    want = {"x": dx, "scale": (weight * x_hat).sum(axes), "B": weight.sum(axes)}
    for k, expected in want.items():
        np.testing.assert_allclose(got[k].astype(np.float64), expected, atol=1e-2 * np.abs(expected).max(), err_msg=k)


_NORM_OPS = {"Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "BatchNormalization",
             "LayerNormalization", "InstanceNormalization", "GroupNormalization", "Dropout"}


@pytest.mark.parametrize("case", [c for c in CASES if c.op in _NORM_OPS], ids=lambda c: c.name)
def test_emitted_ops_have_cuda_kernels_in_bfloat16(case: Case):
    """A rule emits the same ops in float16 and bfloat16 (tests/test_gradients_cuda_ops.py checks
    float16): every backward node of the float16 graph must have a CUDA kernel in bfloat16 for
    the type constraints its float16 operands are bound to."""
    model, wrt = case_model(case, np.float16)
    grad = onnx.shape_inference.infer_shapes(gradient_model(model, "loss", wrt))
    types = {v.name: v.type.tensor_type.elem_type for v in [*grad.graph.value_info, *grad.graph.output]}
    types.update((t.name, t.data_type) for t in grad.graph.initializer)
    opset = grad.opset_import[0].version
    table = kernel_table("CUDAExecutionProvider")
    for node in grad.graph.node:
        if not node.name.startswith("grad_") or node.op_type == "Constant":
            continue
        schema = onnx.defs.get_schema(node.op_type, opset)
        params = {_formal(schema.inputs, i).type_str for i, n in enumerate(node.input)
                  if types.get(n) == TensorProto.FLOAT16}
        params |= {_formal(schema.outputs, i).type_str for i, n in enumerate(node.output)
                   if types.get(n) == TensorProto.FLOAT16}
        if params:  # else integer work (labels, shapes)
            assert table.supports("", node.op_type, opset, "bfloat16", frozenset(params)), \
                f"{case.name}: no CUDA {node.op_type}-{opset} kernel for bfloat16 ({sorted(params)})"


def _formal(formals, i: int):
    return formals[min(i, len(formals) - 1)]
