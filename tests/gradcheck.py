"""Finite-difference checks of gradient graphs (see ``tests/gradcases``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from amp_rewrite.training import gradient_model
from tests.gradcases import Case

EPS = 1e-6


def case_model(case: Case, dtype=np.float64) -> tuple[onnx.ModelProto, list[str]]:
    """The case's node with its inputs as initializers and ``loss = sum_k sum(O(k) * R_k)``;
    returns the model and the names of the differentiated inputs."""
    inits, names, wrt = [], [], []
    for name, array in case.inputs.items():
        if array is None:
            names.append("")
            continue
        names.append(name)
        if array.dtype.kind == "f":
            array = array.astype(dtype)
            if name not in case.constant:
                wrt.append(name)
        inits.append(numpy_helper.from_array(array, name))
    count = case.n_outputs or max(case.outputs) + 1
    outs = [f"out{k}" for k in range(count)]
    node = helper.make_node(case.op, names, outs, domain=case.domain or None, **case.attrs)
    forward = _model([node], inits, [], case.opset, outs, dtype)
    values = dict(zip(outs, ReferenceEvaluator(forward).run(None, {})))
    nodes, loss_terms = [node], []
    for k in case.outputs:
        out = values[outs[k]]
        weight = np.random.default_rng(100 + k).normal(0, 1, out.shape).astype(out.dtype)
        inits.append(numpy_helper.from_array(weight, f"R{k}"))
        nodes += [helper.make_node("Mul", [outs[k], f"R{k}"], [f"weighted{k}"]),
                  helper.make_node("ReduceSum", [f"weighted{k}"], [f"term{k}"], keepdims=0)]
        if out.dtype != np.dtype(dtype):
            nodes.append(helper.make_node("Cast", [f"term{k}"], [f"term{k}_cast"], to=_elem(dtype)))
        loss_terms.append(nodes[-1].output[0])
    nodes.append(helper.make_node("Sum", loss_terms, ["loss"]))
    return _model(nodes, inits, [], case.opset, ["loss"], dtype, shape=[]), wrt


def _elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _model(nodes, inits, inputs, opset, outputs, dtype, shape=None) -> onnx.ModelProto:
    elem = _elem(dtype)
    graph = helper.make_graph(nodes, "case", inputs, [helper.make_tensor_value_info(o, elem, shape) for o in outputs],
                              inits)
    opsets = [helper.make_opsetid("", opset)]
    if any(n.domain == "com.microsoft" for n in nodes):
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def analytic(model: onnx.ModelProto, wrt: list[str], runner: str = "reference") -> dict[str, np.ndarray]:
    grad = gradient_model(model, "loss", wrt)
    onnx.checker.check_model(grad, full_check=True)
    names = [f"{w}_grad" for w in wrt]
    if runner == "reference":
        return dict(zip(names, ReferenceEvaluator(grad).run(names, {})))
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(grad.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, {})))


def numeric(model: onnx.ModelProto, wrt: list[str], eps: float = EPS) -> dict[str, np.ndarray]:
    """Central differences of the loss for every element of every parameter (float64)."""
    base = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    grads = {}
    for name in wrt:
        x = base[name]
        g = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            values = []
            for sign in (1, -1):
                shifted = x.copy()
                shifted[i] += sign * eps
                values.append(_loss(model, name, shifted))
            g[i] = (values[0] - values[1]) / (2 * eps)
        grads[f"{name}_grad"] = g
    return grads


def _loss(model: onnx.ModelProto, name: str, array: np.ndarray) -> float:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(array, name))
    return float(ReferenceEvaluator(m).run(["loss"], {})[0])


def assert_close(got: dict, want: dict, rtol: float, atol: float, label: str) -> None:
    for name, expected in want.items():
        actual = np.asarray(got[name], dtype=np.float64)
        assert actual.shape == expected.shape, f"{label} {name}: shape {actual.shape} != {expected.shape}"
        scale = max(float(np.abs(expected).max()), 1e-3)
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol + rtol * scale, err_msg=f"{label} {name}")




def with_loss(model: onnx.ModelProto, feeds: dict[str, np.ndarray], seed: int = 0) -> onnx.ModelProto:
    """``model`` with one more output ``loss = sum(out * R)`` over its first float output, ``R`` fixed
    random weights shaped like that output on ``feeds``."""
    out = next(o.name for o in model.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT)
    value = ort_run(model, feeds, [out])[out]
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weight = np.random.default_rng(seed).normal(0, 1, value.shape).astype(np.float32)
    copy.graph.initializer.append(numpy_helper.from_array(weight, "loss_weights"))
    copy.graph.node.extend([helper.make_node("Mul", [out, "loss_weights"], ["loss_terms"]),
                            helper.make_node("ReduceSum", ["loss_terms"], ["loss"], keepdims=0)])
    copy.graph.output.append(helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    return copy


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


def spread_weights(model: onnx.ModelProto, count: int = 3) -> list[str]:
    """Float initializers read near the input, in the middle and near the output (by first reader)."""
    weights = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims}
    order = list(dict.fromkeys(i for n in model.graph.node for i in n.input if i in weights))
    order = [w for w in order if w != "loss_weights"]
    picks = sorted({0, len(order) // 2, len(order) - 1})[:count]
    return [order[i] for i in picks]


def directional_check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], wrt: list[str], step: float = 1e-3,
                      rtol: float = 3e-2) -> onnx.ModelProto:
    """Compare <grad W, V> with (L(W + tV) - L(W - tV)) / 2t for a random direction V scaled like W,
    on ONNX Runtime in float32 (a whole-tensor check that costs two runs per weight)."""
    grad = gradient_model(model, "loss", wrt)
    onnx.checker.check_model(grad, full_check=True)
    got = ort_run(grad, feeds, [f"{w}_grad" for w in wrt])
    tensors = {t.name: t for t in model.graph.initializer}
    rng = np.random.default_rng(1)
    for name in wrt:
        w = numpy_helper.to_array(tensors[name]).astype(np.float64)
        direction = rng.normal(0, 1, w.shape)
        direction *= (np.linalg.norm(w) or 1.0) / np.linalg.norm(direction)
        losses = []
        for sign in (1, -1):
            shifted = onnx.ModelProto()
            shifted.CopyFrom(model)
            for t in shifted.graph.initializer:
                if t.name == name:
                    t.CopyFrom(numpy_helper.from_array((w + sign * step * direction).astype(np.float32), name))
            losses.append(float(ort_run(shifted, feeds, ["loss"])["loss"]))
        numeric_slope = (losses[0] - losses[1]) / (2 * step)
        analytic_slope = float(np.sum(got[f"{name}_grad"].astype(np.float64) * direction))
        scale = np.linalg.norm(got[f"{name}_grad"]) * np.linalg.norm(direction)
        assert abs(numeric_slope - analytic_slope) <= rtol * abs(analytic_slope) + 1e-3 * scale, \
            f"{name}: finite difference {numeric_slope:.6g} vs gradient {analytic_slope:.6g}"
    return grad
