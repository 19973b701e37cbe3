"""Gradients through If (both branches, nested, values exported from a branch) and the
clear error for Loop/Scan."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite import UserError
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


def test_loop_on_the_path_is_a_clear_error():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Mul", ["acc", "W"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [2])])
    inits = [numpy_helper.from_array(np.array(3, np.int64), "n"), numpy_helper.from_array(np.array(True), "t"),
             numpy_helper.from_array(np.ones(2), "x0"), numpy_helper.from_array(np.ones(2) * 0.5, "W")]
    nodes = [helper.make_node("Loop", ["n", "t", "x0"], ["acc_final"], body=body, name="the_loop"),
             helper.make_node("ReduceSum", ["acc_final"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "loop", [], [helper.make_tensor_value_info("loss", F, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UserError, match=r"no gradient rule for Loop \(domain ai.onnx, opset 17\) at node 'the_loop'"):
        gradient_model(model, "loss")
