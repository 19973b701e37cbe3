"""Finite-difference checks of gradient graphs (see ``tests/gradcases``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amp_rewrite.ir.tensors import initializer_to_input
from amp_rewrite.training import gradient_model
from tests.gradcases import Case
from tests.reference_ops import evaluator

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
    values = dict(zip(outs, evaluator(forward).run(None, {})))
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
        return dict(zip(names, evaluator(grad).run(names, {})))
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(grad.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, {})))


def numeric(model: onnx.ModelProto, wrt: list[str], eps: float = EPS,
            runner: str = "reference") -> dict[str, np.ndarray]:
    """Central differences of the loss for every element of every parameter (float64), run by
    onnx's reference evaluator or (``runner="ort"``) ONNX Runtime."""
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
                values.append(_loss(model, name, shifted, runner))
            g[i] = (values[0] - values[1]) / (2 * eps)
        grads[f"{name}_grad"] = g
    return grads


def _loss(model: onnx.ModelProto, name: str, array: np.ndarray, runner: str) -> float:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(array, name))
    if runner == "ort":
        return float(ort_run(m, {}, ["loss"])["loss"])
    return float(evaluator(m).run(["loss"], {})[0])


def assert_close(got: dict, want: dict, rtol: float, atol: float, label: str) -> None:
    for name, expected in want.items():
        actual = np.asarray(got[name], dtype=np.float64)
        assert actual.shape == expected.shape, f"{label} {name}: shape {actual.shape} != {expected.shape}"
        scale = max(float(np.abs(expected).max()), 1e-3)
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol + rtol * scale, err_msg=f"{label} {name}")




def with_loss(model: onnx.ModelProto, feeds: dict[str, np.ndarray], seed: int = 0) -> onnx.ModelProto:
    """``model`` with one more output ``loss = sum(out * R)``, ``R`` fixed random weights shaped like
    ``out``: its first float output, or the logits when that output is a Softmax's (a saturated
    Softmax has gradients too small for a finite difference to see)."""
    out = next(o.name for o in model.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT)
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers.get(out)
    while node is not None and node.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"):
        node = producers.get(node.input[0])
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if node is not None and node.op_type == "Softmax":
        out = node.input[0]
        copy.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    value = ort_run(copy, feeds, [out])[out]
    if node is not None and node.op_type == "Softmax":
        copy.graph.output.pop()
    weight = np.random.default_rng(seed).normal(0, 1, value.shape).astype(np.float32)
    copy.graph.initializer.append(numpy_helper.from_array(weight, "loss_weights"))
    if copy.ir_version < 4:  # initializers are listed as inputs too
        copy.graph.input.append(helper.make_tensor_value_info("loss_weights", onnx.TensorProto.FLOAT, value.shape))
    copy.graph.node.extend([helper.make_node("Mul", [out, "loss_weights"], ["loss_terms"]),
                            helper.make_node("ReduceSum", ["loss_terms"], ["loss"], keepdims=0)])
    copy.graph.output.append(helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, []))
    return copy


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1  # the suite runs one worker per core
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


def spread_weights(model: onnx.ModelProto, count: int = 3) -> list[str]:
    """Differentiable weights read near the input, in the middle and near the output (by first reader)."""
    from amp_rewrite.autodiff.gradient import default_parameters

    weights = set(default_parameters(model, "loss")) - {"loss_weights"}
    order = list(dict.fromkeys(i for n in model.graph.node for i in n.input if i in weights))
    picks = sorted({0, len(order) // 2, len(order) - 1})[:count]
    return [order[i] for i in picks]


def directional_check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], wrt: list[str], step: float = 1e-4,
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
        session = _session_with_input(model, name)
        slopes = [_slope(session, feeds, name, w, direction, h) for h in (step, 2 * step)]
        analytic_slope = float(np.sum(got[f"{name}_grad"].astype(np.float64) * direction))
        # Float32 rounding through a deep network makes the difference noisy: what two step sizes
        # disagree by is the noise allowed (and never less than the terms' own rounding).
        noise = 2 * abs(slopes[0][0] - slopes[1][0]) + 1e-7 * slopes[0][1] / step
        assert abs(slopes[0][0] - analytic_slope) <= rtol * abs(analytic_slope) + noise, \
            f"{name}: finite difference {slopes[0][0]:.6g} vs gradient {analytic_slope:.6g} (noise {noise:.2g})"
    return grad


def _session_with_input(model: onnx.ModelProto, name: str):
    """A session over ``model`` with the initializer ``name`` made an input and ``loss_terms`` an output."""
    import onnxruntime as ort

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    tensor = next(t for t in copy.graph.initializer if t.name == name)
    initializer_to_input(copy.graph, tensor, tensor.data_type)
    copy.graph.output.append(helper.make_tensor_value_info("loss_terms", onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(copy.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _slope(session, feeds, name, w, direction, step) -> tuple[float, float]:
    """(central difference of the loss along ``direction``, sum of the loss terms' magnitudes);
    the terms are summed in float64, so only their own float32 rounding remains."""
    terms = [session.run(["loss_terms"], {**feeds, name: (w + sign * step * direction).astype(np.float32)})[0]
             .astype(np.float64) for sign in (1, -1)]
    return float(np.sum(terms[0] - terms[1])) / (2 * step), float(np.sum(np.abs(terms[0])))
