"""A standard loss is the loss of the named output: a softmax written out (Exp, ReduceSum, Div)
gets the cross-entropy of its probabilities, a sigmoid binary cross-entropy, logits the
log-softmax; and after training, the loss the step reports is checked against the loss of the
trained model's own output, failing loudly where they disagree."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.training import build
from amp_rewrite.training.graph.losses import reference_loss
from amp_rewrite.training.runner.trainer import Trainer
from tests.gradcheck import ort_run
from tests.helpers import rng

CLASSES = 3


def _classifier(head: str) -> onnx.ModelProto:
    """x[N,4] -> Gemm -> z[N,3] -> ``head``: "logits" (z), "softmax" (a Softmax node),
    "written" (Exp(z - max z) / ReduceSum), "reciprocal" (Exp(z) * Reciprocal(ReduceSum)),
    "matmul-sum" (Exp(z) / (Exp(z) @ ones): a softmax no rule recognizes), "sigmoid"."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["z"])]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    inits = [numpy_helper.from_array(rng(1).normal(0, 1, (4, CLASSES)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b"), axes,
             numpy_helper.from_array(np.ones((CLASSES, CLASSES), np.float32), "ones")]
    if head == "logits":
        nodes.append(helper.make_node("Identity", ["z"], ["out"]))
    elif head == "softmax":
        nodes.append(helper.make_node("Softmax", ["z"], ["out"], axis=1))
    elif head == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["z"], ["out"]))
    elif head == "written":
        nodes += [helper.make_node("ReduceMax", ["z", "axes"], ["m"], keepdims=1),
                  helper.make_node("Sub", ["z", "m"], ["s"]), helper.make_node("Exp", ["s"], ["e"]),
                  helper.make_node("ReduceSum", ["e", "axes"], ["t"], keepdims=1),
                  helper.make_node("Div", ["e", "t"], ["out"])]
    elif head == "reciprocal":
        nodes += [helper.make_node("Exp", ["z"], ["e"]), helper.make_node("ReduceSum", ["e", "axes"], ["t"]),
                  helper.make_node("Reciprocal", ["t"], ["r"]), helper.make_node("Mul", ["e", "r"], ["out"])]
    else:
        nodes += [helper.make_node("Exp", ["z"], ["e"]), helper.make_node("MatMul", ["e", "ones"], ["t"]),
                  helper.make_node("Div", ["e", "t"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", CLASSES])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _data(head: str, n: int = 64) -> dict[str, np.ndarray]:
    x = rng(2).normal(0, 1, (n, 4)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    if head == "sigmoid":
        return {"x": x, "labels": np.eye(CLASSES, dtype=np.float32)[labels]}
    return {"x": x, "labels": labels}


@pytest.mark.parametrize("head", ["logits", "softmax", "written", "reciprocal", "sigmoid"])
def test_the_cross_entropy_is_the_cross_entropy_of_the_named_output(head) -> None:
    model = _classifier(head)
    step = build(model, loss="cross-entropy", output="out", precision="float32")
    data = _data(head, 16)
    found = ort_run(step.forward, data, [step.spec.loss, "out"])
    expected, kept = reference_loss("cross-entropy", found["out"], data["labels"])
    assert len(kept) == 16 and abs(float(found[step.spec.loss]) - expected) < 1e-5 * max(1.0, expected)
    trainer = Trainer(step, lr=0.05)
    before = trainer.evaluate(data)["loss"]
    trainer.fit(data, epochs=5, batch_size=16, progress=False)  # check_loss runs at the end
    assert trainer.evaluate(data)["loss"] < before


def test_a_softmax_no_rule_recognizes_fails_loudly_after_training() -> None:
    """Probabilities summed by a MatMul with ones: the step takes them for logits (a log-softmax of
    probabilities, whose loss falls while the real cross-entropy rises); the check says so."""
    step = build(_classifier("matmul-sum"), loss="cross-entropy", output="out", precision="float32",
                 params=["w", "b"])  # the ones stay ones
    trainer = Trainer(step, lr=0.05)
    with pytest.raises(UserError, match=r"the cross-entropy loss the step computes \(.*\) is not the cross-entropy "
                                        r"of 'out' \(.* from its own values\)"):
        trainer.fit(_data("matmul-sum"), epochs=1, batch_size=16, progress=False)


def test_the_reference_leaves_out_probabilities_too_small_to_read() -> None:
    probs = np.array([[0.5, 0.25, 0.25], [1 - 1e-7, 1e-7 / 2, 1e-7 / 2]], np.float32)
    loss, kept = reference_loss("cross-entropy", probs, np.array([0, 1]))
    assert kept.tolist() == [0] and loss == pytest.approx(np.log(2))
    assert reference_loss("cross-entropy", probs[1:], np.array([1])) is None
    logits = np.array([[2.0, 0.0, -1.0]], np.float32)
    assert reference_loss("cross-entropy", logits, np.array([0]))[0] == pytest.approx(
        -np.log(np.exp(2.0) / np.exp(logits[0].astype(np.float64)).sum()))
