"""ai.onnx.ml's linear models (weights in attributes, as scikit-learn's converters write them)
lower to standard ops that compute what ONNX Runtime's kernels compute, train, and are written
back into the attributes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_rewrite.cli import main
from amp_rewrite.training.adapters.attribute_weights import lower
from tests.gradcheck import directional_check, ort_run, with_loss
from tests.helpers import rng

FEATURES = 4


def _model(node: onnx.NodeProto, outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   ["N", FEATURES])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)],
                             ir_version=8)


def _classifier(classes: list, rows: int, transform: str) -> onnx.ModelProto:
    labels = {"classlabels_strings": classes} if isinstance(classes[0], str) else {"classlabels_ints": classes}
    node = helper.make_node("LinearClassifier", ["x"], ["label", "probabilities"], domain="ai.onnx.ml", name="clf",
                            coefficients=rng(1).normal(0, 1, rows * FEATURES).tolist(),
                            intercepts=rng(2).normal(0, 1, rows).tolist(), post_transform=transform, **labels)
    label_type = TensorProto.STRING if isinstance(classes[0], str) else TensorProto.INT64
    return _model(node, [helper.make_tensor_value_info("label", label_type, ["N"]),
                         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", len(classes)])])


def _regressor(targets: int) -> onnx.ModelProto:
    node = helper.make_node("LinearRegressor", ["x"], ["variable"], domain="ai.onnx.ml", targets=targets,
                            coefficients=rng(1).normal(0, 1, targets * FEATURES).tolist(),
                            intercepts=rng(2).normal(0, 1, targets).tolist())
    return _model(node, [helper.make_tensor_value_info("variable", TensorProto.FLOAT, ["N", targets])])


def _normalizer(norm: str) -> onnx.ModelProto:
    return _model(helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm=norm),
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])])


def _x(n: int = 16) -> np.ndarray:
    return rng(3).normal(0, 2, (n, FEATURES)).astype(np.float32)


CASES = {
    **{f"classifier {t}": (lambda t=t: _classifier([3, 5, 9], 3, t)) for t in ("NONE", "LOGISTIC", "SOFTMAX")},
    **{f"binary {t}": (lambda t=t: _classifier([0, 1], 1, t)) for t in ("NONE", "LOGISTIC")},
    "string labels": lambda: _classifier(["cat", "dog", "eel"], 3, "SOFTMAX"),
    "regressor": lambda: _regressor(1), "regressor of 2 targets": lambda: _regressor(2),
    **{f"normalizer {n}": (lambda n=n: _normalizer(n)) for n in ("L1", "L2", "MAX")},
}


@pytest.mark.parametrize("case", CASES)
def test_the_lowered_model_computes_what_onnx_runtime_computes(case) -> None:
    model = CASES[case]()
    low = onnx.ModelProto.FromString(model.SerializeToString())
    made = lower(low)
    onnx.checker.check_model(low, full_check=True)
    assert not [n for n in low.graph.node if n.domain == "ai.onnx.ml"]
    assert sorted(made) == sorted(t.name for t in low.graph.initializer)
    names = [o.name for o in model.graph.output]
    want, got = ort_run(model, {"x": _x()}, names), ort_run(low, {"x": _x()}, names)
    for name in names:
        if want[name].dtype == object:
            assert (want[name] == got[name]).all(), name
        else:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_forms_it_does_not_know_stay_as_they_are() -> None:
    for model in (_classifier([3, 5, 9], 3, "PROBIT"), _classifier([3, 5, 9], 3, "SOFTMAX_ZERO"),
                  _classifier([0, 1], 1, "SOFTMAX")):
        before = model.SerializeToString()
        assert lower(model) == []
        assert model.SerializeToString() == before


@pytest.mark.parametrize("case", ["classifier SOFTMAX", "binary LOGISTIC", "regressor of 2 targets"])
def test_gradients_of_the_lowered_weights_match_finite_differences(case) -> None:
    model = CASES[case]()
    lower(model)
    model.graph.output.pop(0) if len(model.graph.output) > 1 else None  # the labels: not a float output
    directional_check(with_loss(model, {"x": _x()}), {"x": _x()}, sorted(t.name for t in model.graph.initializer))


def _scaled_classifier() -> onnx.ModelProto:
    """scikit-learn's logistic regression as skl2onnx writes it: Scaler -> LinearClassifier
    (LOGISTIC, one-vs-rest) -> Normalizer (L1)."""
    model = _classifier([0, 1, 2], 3, "LOGISTIC")
    clf = model.graph.node[0]
    clf.input[0], clf.output[1] = "scaled", "scores"
    model.graph.node.insert(0, helper.make_node("Scaler", ["x"], ["scaled"], domain="ai.onnx.ml",
                                                offset=[0.5] * FEATURES, scale=[2.0] * FEATURES))
    model.graph.node.append(helper.make_node("Normalizer", ["scores"], ["probabilities"], domain="ai.onnx.ml",
                                             norm="L1"))
    return model


def test_train_writes_the_trained_coefficients_back_into_the_attributes(tmp_path) -> None:
    model = _scaled_classifier()
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "t.onnx"
    onnx.save(model, path)
    x = _x(64)
    target = np.eye(3, dtype=np.float32)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0)]
    np.savez(data, x=x, labels=target)
    assert main(["train", str(path), "--data", str(data), "--loss", "mse", "--output", "probabilities",
                 "--epochs", "20", "--lr", "0.05", "--precision", "float32", "-o", str(out), "--quiet"]) == 0
    trained = onnx.load(out)
    assert [(n.name, n.op_type, n.domain, list(n.input), list(n.output)) for n in trained.graph.node] == \
        [(n.name, n.op_type, n.domain, list(n.input), list(n.output)) for n in model.graph.node]
    attributes = [{a.name: list(a.floats) for a in n.attribute} for n in (model.graph.node[1], trained.graph.node[1])]
    assert attributes[0]["coefficients"] != attributes[1]["coefficients"]
    assert attributes[0]["intercepts"] != attributes[1]["intercepts"]

    def mse(m):
        return np.mean((ort_run(m, {"x": x}, ["probabilities"])["probabilities"] - target) ** 2)

    assert mse(trained) < 0.8 * mse(model)


def test_a_model_with_no_trainable_weight_is_refused_in_one_line() -> None:
    """A tree ensemble of a MIN aggregate (not linear in its leaf values, so not lowered) keeps its
    parameters in attributes no gradient reaches: nothing to train."""
    from amp_rewrite.errors import UserError
    from amp_rewrite.training import build

    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["variable"], domain="ai.onnx.ml", n_targets=1,
                            aggregate_function="MIN",
                            nodes_treeids=[0], nodes_nodeids=[0], nodes_featureids=[0], nodes_values=[0.0],
                            nodes_modes=["LEAF"], nodes_truenodeids=[0], nodes_falsenodeids=[0],
                            target_treeids=[0], target_nodeids=[0], target_ids=[0], target_weights=[1.5])
    model = _model(node, [helper.make_tensor_value_info("variable", TensorProto.FLOAT, ["N", 1])])
    with pytest.raises(UserError, match="depends on no trainable weight: nothing to train "
                                        r"\(TreeEnsembleRegressor 'variable' keeps its parameters in attributes"):
        build(model, loss="mse", output="variable", precision="float32")
