"""Gradients through If (both branches, nested, values exported from a branch) and Loop (carried
states, outer weights, scan outputs), and the clear error for Scan."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from amp_rewrite.training import gradient_model
from tests.gradcheck import analytic, assert_close, numeric

F = TensorProto.DOUBLE


def _branch(name, nodes, out):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F, None)])


def _if_model(cond: bool, nested: bool = False) -> onnx.ModelProto:
    """loss = sum(If(c, then: tanh(x @ W1) * W2, else: exp(x) @ W1 [nested If on c2]) * R)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, s), n) for n, s in
             (("x", (2, 3)), ("W1", (3, 3)), ("W2", (3,)), ("R", (2, 3)))]
    inits += [numpy_helper.from_array(np.array(cond), "c"), numpy_helper.from_array(np.array(not cond), "c2")]
    then = _branch("then", [helper.make_node("MatMul", ["x", "W1"], ["t1"]), helper.make_node("Tanh", ["t1"], ["t2"]),
                            helper.make_node("Mul", ["t2", "W2"], ["t3"])], "t3")
    else_nodes = [helper.make_node("Exp", ["x"], ["e1"]), helper.make_node("MatMul", ["e1", "W1"], ["e2"])]
    if nested:
        inner_then = _branch("inner_then", [helper.make_node("Sigmoid", ["e2"], ["n1"]),
                                            helper.make_node("Mul", ["n1", "W2"], ["n2"])], "n2")
        inner_else = _branch("inner_else", [helper.make_node("Mul", ["e2", "e2"], ["m1"])], "m1")
        else_nodes.append(helper.make_node("If", ["c2"], ["e3"], then_branch=inner_then, else_branch=inner_else))
    otherwise = _branch("else", else_nodes, else_nodes[-1].output[0])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=otherwise),
             helper.make_node("Mul", ["y", "R"], ["w"]), helper.make_node("ReduceSum", ["w"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "if", [], [helper.make_tensor_value_info("loss", F, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("cond", [True, False], ids=["then", "else"])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_if_gradients_match_finite_differences(cond, nested):
    model = _if_model(cond, nested)
    wrt = ["x", "W1", "W2"]
    want = numeric(model, wrt)
    assert_close(analytic(model, wrt), want, 1e-5, 1e-7, "If (reference)")
    assert_close(analytic(model, wrt, runner="ort"), want, 1e-6, 1e-8, "If (ONNX Runtime, float64)")


def test_if_branch_values_are_exported_not_recomputed():
    """The backward branch reads the forward branch's tanh through an extra If output: no second Tanh."""
    grad = gradient_model(_if_model(True), "loss", ["W2"])
    forward_if = next(n for n in grad.graph.node if n.op_type == "If" and n.output[0] == "y")
    assert len(forward_if.output) > 1, "the forward If exports what its backward needs"
    backward_if = [n for n in grad.graph.node if n.op_type == "If" and n is not forward_if]
    assert len(backward_if) == 1
    then = next(a.g for a in backward_if[0].attribute if a.name == "then_branch")
    assert "Tanh" not in {n.op_type for n in then.node}


def _loop_model(trips: int = 3) -> onnx.ModelProto:
    """h <- tanh(h @ W + b) for ``trips`` iterations, each also emitting y = h * h (a scan output);
    loss = sum(h_final * R1) + sum(ys * R2)."""
    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h", "W"], ["hw"]), helper.make_node("Add", ["hw", "b"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]), helper.make_node("Mul", ["h_out", "h_out"], ["y"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", F, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", F,
                                                                                                      [2, 3]),
         helper.make_tensor_value_info("y", F, [2, 3])])
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "n"), numpy_helper.from_array(np.array(True), "t")]
    inits += [numpy_helper.from_array(rng.normal(0, 0.7, s), n) for n, s in
              (("h0", (2, 3)), ("W", (3, 3)), ("b", (3,)), ("R1", (2, 3)), ("R2", (trips, 2, 3)))]
    nodes = [helper.make_node("Loop", ["n", "t", "h0"], ["h_final", "ys"], body=body, name="the_loop"),
             helper.make_node("Mul", ["h_final", "R1"], ["a"]),
             helper.make_node("ReduceSum", ["a"], ["la"], keepdims=0),
             helper.make_node("Mul", ["ys", "R2"], ["c"]), helper.make_node("ReduceSum", ["c"], ["lc"], keepdims=0),
             helper.make_node("Add", ["la", "lc"], ["loss"])]
    graph = helper.make_graph(nodes, "loop", [], [helper.make_tensor_value_info("loss", F, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("trips", [1, 3])
def test_loop_gradients_match_finite_differences(trips):
    """On ONNX Runtime in float64 only: onnx 1.23's reference evaluator concatenates a Loop's scan
    outputs instead of stacking them, and computes this backward Loop wrongly (off by up to 2.2
    with one trip, where ONNX Runtime agrees with the finite differences to 1e-10)."""
    model = _loop_model(trips)
    wrt = ["h0", "W", "b"]
    want = numeric(model, wrt, runner="ort")
    assert_close(analytic(model, wrt, runner="ort"), want, 1e-6, 1e-8, "Loop (ONNX Runtime, float64)")


def test_loop_backward_reads_forward_values_instead_of_recomputing():
    grad = gradient_model(_loop_model(), "loss", ["W"])
    loops = [n for n in grad.graph.node if n.op_type == "Loop"]
    assert len(loops) == 2 and len(loops[0].output) > 2  # the forward Loop exports its iterations' values
    backward_body = next(a.g for a in loops[1].attribute if a.name == "body")
    assert "Tanh" not in {n.op_type for n in backward_body.node}


def test_a_scan_on_the_path_is_unrolled_and_differentiated():
    """a_final = a0 * xs[0] * xs[1] * xs[2] (a Scan that multiplies): d/da0 is the product of
    the rows, d/dxs[t] the product of a0 and the other rows (the Scan test module checks
    finite differences; tests/test_scan.py)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc", "x_t"], ["acc_out"]), helper.make_node("Identity", ["acc_out"], ["y_t"])],
        "body", [helper.make_tensor_value_info("acc", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("acc_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])])
    xs = np.array([[0.5, 2.0], [3.0, 0.25], [1.5, -1.0]])
    inits = [numpy_helper.from_array(np.array([2.0, 3.0]), "a0"), numpy_helper.from_array(xs, "xs")]
    nodes = [helper.make_node("Scan", ["a0", "xs"], ["a_final", "ys"], body=body, num_scan_inputs=1,
                              name="the_scan"),
             helper.make_node("ReduceSum", ["a_final"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "scan", [], [helper.make_tensor_value_info("loss", F, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    grad = gradient_model(model, "loss")
    assert "Scan" not in {n.op_type for n in grad.graph.node}
    got = dict(zip(["a0", "xs"], ReferenceEvaluator(grad).run(["a0_grad", "xs_grad"], {})))
    product = xs.prod(axis=0)
    assert np.allclose(got["a0"], product)
    assert np.allclose(got["xs"], np.array([2.0, 3.0]) * product / xs)


def test_a_loop_body_whose_own_constants_the_backward_reads():
    """tf2onnx writes a Keras GRU's step as a Loop whose body holds its Slice bounds as its own
    initializers: the backward Loop read them out of scope (ONNX Runtime: "not output of any
    previous nodes")."""
    model = _loop_model(3)
    body = model.graph.node[0].attribute[0].g
    body.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "start"),
                             numpy_helper.from_array(np.array([2], np.int64), "end"),
                             numpy_helper.from_array(np.array([1], np.int64), "axis")])
    pre = next(n for n in body.node if n.output[0] == "pre")
    pre.output[0] = "pre_full"
    body.node.insert(list(body.node).index(pre) + 1, helper.make_node("Slice", ["pre_full", "start", "end", "axis"],
                                                                       ["pre_part"]))
    body.node.insert(list(body.node).index(pre) + 2, helper.make_node("Pad", ["pre_part", "pads"], ["pre"]))
    body.initializer.append(numpy_helper.from_array(np.array([0, 0, 0, 1], np.int64), "pads"))
    wrt = ["h0", "W", "b"]
    assert_close(analytic(model, wrt, runner="ort"), numeric(model, wrt, runner="ort"), 1e-6, 1e-8,
                 "Loop with body constants (ONNX Runtime, float64)")
