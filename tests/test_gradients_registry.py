"""The rule table: every op the product promises has a rule and a finite-difference case, and an
op without a rule is one clear error naming the op, its domain, opset and node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from amp_rewrite import UserError
from amp_rewrite.autodiff.registry import lookup, rules
from amp_rewrite.cli import main
from amp_rewrite.training import gradient_model
from tests.gradcases import CASES
from tests.gradcheck import ort_run

PROMISED = (
    "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Exp",
    "Log", "Sqrt", "Pow", "Clip", "Max", "Min", "Where", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss",
    "ReduceMean", "ReduceSum", "Reshape", "Flatten", "Transpose", "Concat", "Split", "Slice", "Gather", "Squeeze",
    "Unsqueeze", "Expand", "Pad", "Resize", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
    "BatchNormalization", "LayerNormalization", "InstanceNormalization", "Dropout", "Cast", "Identity", "HardSigmoid",
    "HardSwish", "Softplus", "If",
)
"""The ops issue 7 names; each needs a rule and a finite-difference case."""
TESTED_ELSEWHERE = {"If": "tests/test_gradients_control.py", "Loop": "tests/test_gradients_control.py",
                    "QuantizeLinear": "tests/test_gradients_quantize.py",
                    "DequantizeLinear": "tests/test_gradients_quantize.py"}


@pytest.mark.parametrize("op", PROMISED)
def test_every_promised_op_has_a_rule_and_a_case(op):
    assert lookup("", op, 17) is not None, f"no rule for {op} at opset 17"
    assert op in {c.op for c in CASES} or op in TESTED_ELSEWHERE, f"no finite-difference case for {op}"


def test_every_rule_has_a_case():
    covered = {c.op for c in CASES} | set(TESTED_ELSEWHERE)
    untested = sorted(op for (_, op), entries in rules().items() if op not in covered and not entries[0].zero)
    assert not untested, f"rules without a finite-difference case: {untested}"


def _model_with(op: str, domain: str = ""):
    w = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    nodes = [helper.make_node(op, ["w"], ["y"], name="the_node", domain=domain or None),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("loss", 1, [])], [w])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def test_missing_rule_names_op_domain_opset_and_node():
    with pytest.raises(UserError, match=r"^no gradient rule for Det \(domain ai.onnx, opset 17\) at node 'the_node'"):
        gradient_model(_model_with("Det"), "loss")


def test_missing_rule_in_another_domain():
    with pytest.raises(UserError, match=r"no gradient rule for Inverse \(domain com.microsoft, opset 1\)"):
        gradient_model(_model_with("Inverse", "com.microsoft"), "loss")


def test_cli_grad_missing_rule_is_one_line_and_exit_2(tmp_path, capsys):
    import onnx

    source, target = tmp_path / "m.onnx", tmp_path / "g.onnx"
    onnx.save(_model_with("Det"), source)
    assert main(["grad", str(source), "--loss", "loss", "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no gradient rule for Det" in err
    assert not target.exists()


@pytest.mark.parametrize("args, message", [
    (["--loss", "nope"], "loss 'nope' is not an output"),
    (["--loss", "loss", "--wrt", "x"], "'x' is not an initializer or input"),
])
def test_cli_grad_user_errors(tmp_path, capsys, args, message):
    import onnx

    source, target = tmp_path / "m.onnx", tmp_path / "g.onnx"
    onnx.save(_model_with("Relu"), source)
    before = source.read_bytes()
    assert main(["grad", str(source), *args, "-o", str(target)]) == 2
    assert message in capsys.readouterr().err
    assert not target.exists() and source.read_bytes() == before


def test_cli_grad_writes_a_runnable_model(tmp_path, capsys):
    import onnx

    source, target = tmp_path / "m.onnx", tmp_path / "g.onnx"
    onnx.save(_model_with("Relu"), source)
    assert main(["grad", str(source), "--loss", "loss", "-o", str(target)]) == 0
    assert "1 gradient of 'loss'" in capsys.readouterr().out
    grad = onnx.load(target)
    onnx.checker.check_model(grad, full_check=True)
    np.testing.assert_array_equal(ort_run(grad, {}, ["w_grad"])["w_grad"], np.eye(3) > 0)


def test_non_scalar_loss_is_refused():
    model = _model_with("Relu")
    model.graph.output.append(helper.make_tensor_value_info("y", 1, [3, 3]))
    with pytest.raises(UserError, match="must be a scalar"):
        gradient_model(model, "y")


def test_a_weight_read_only_as_a_constant_is_refused():
    """A Clip bound gets no gradient: asking for one is an error, not a silent zero."""
    x = numpy_helper.from_array(np.array([0.5, 2.0], np.float32), "x")
    high = numpy_helper.from_array(np.array(1.0, np.float32), "high")
    nodes = [helper.make_node("Clip", ["x", "", "high"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"],
                                                                                  keepdims=0)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("loss", 1, [])], [x, high])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UserError, match="does not depend on 'high' through a differentiable input"):
        gradient_model(model, "loss", ["x", "high"])
    assert [o.name for o in gradient_model(model, "loss").graph.output] == ["loss", "x_grad"]


def test_gradient_model_takes_a_path_a_proto_or_an_onnx_ir_model(tmp_path):
    import onnx
    import onnx_ir as ir

    model = _model_with("Relu")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    before = model.SerializeToString()
    results = [gradient_model(m, "loss") for m in (model, str(path), ir.serde.deserialize_model(model))]
    assert model.SerializeToString() == before  # the argument is never modified
    for grad in results:
        assert [o.name for o in grad.graph.output] == ["loss", "w_grad"]
        np.testing.assert_array_equal(ort_run(grad, {}, ["w_grad"])["w_grad"], np.eye(3) > 0)
