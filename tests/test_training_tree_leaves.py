"""ai.onnx.ml's tree ensembles (leaf values in attributes, as scikit-learn, XGBoost and LightGBM
converters write them) lower to an indicator ensemble times trainable leaf values, compute what
ONNX Runtime computes (its binary-classification rules included), and are written back."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.cli import main
from amp_rewrite.training.adapters.attribute_weights import lower, write_back
from tests.gradcheck import directional_check, ort_run, with_loss
from tests.helpers import rng

FEATURES, DEPTH = 4, 2
LEAVES = range(2**DEPTH - 1, 2 ** (DEPTH + 1) - 1)


def _trees(count: int, seed: int, modes=("BRANCH_LEQ",), missing: bool = False) -> dict:
    """``count`` complete trees of depth 2 as ``nodes_*`` attributes; thresholds on the 0.5 grid
    the inputs are drawn from, so rows fall on them."""
    r, nodes = rng(seed), {}
    for t, n in itertools.product(range(count), range(2 ** (DEPTH + 1) - 1)):
        branch = n not in LEAVES
        for key, value in (("treeids", t), ("nodeids", n), ("featureids", int(r.integers(FEATURES)) * branch),
                           ("values", float(r.integers(-4, 5)) / 2 * branch),
                           ("modes", str(r.choice(modes)) if branch else "LEAF"),
                           ("truenodeids", (2 * n + 1) * branch), ("falsenodeids", (2 * n + 2) * branch),
                           ("missing_value_tracks_true", int(missing and branch and r.random() < 0.5))):
            nodes.setdefault(f"nodes_{key}", []).append(value)
    return nodes


def _entries(prefix: str, count: int, names, seed: int, sign: float = 1.0) -> dict:
    """The ``<prefix>_*`` weight entries naming ``names(tree, leaf)`` at each leaf; weights of
    ``sign`` (0: either sign), some of them 0."""
    r, entries = rng(seed), {}
    for t, leaf in itertools.product(range(count), LEAVES):
        for target in names(t, leaf):
            weight = float(r.uniform(0.05, 0.6) * (sign or r.choice([-1, 1])) * (r.random() > 0.15))
            for key, value in (("treeids", t), ("nodeids", leaf), ("ids", target), ("weights", weight)):
                entries.setdefault(f"{prefix}_{key}", []).append(value)
    return entries


def _model(op: str, outputs: list[onnx.ValueInfoProto], count: int = 3, **attributes) -> onnx.ModelProto:
    nodes = _trees(count, 1) if "nodes_modes" not in attributes else {}
    node = helper.make_node(op, ["x"], [o.name for o in outputs], domain="ai.onnx.ml", name="trees",
                            **nodes, **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          ["N", FEATURES])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 1)], ir_version=8)


def _regressor(targets: int, names=None, count: int = 3, **attributes) -> onnx.ModelProto:
    entries = _entries("target", count, names or (lambda t, leaf: range(targets)), seed=2, sign=0)
    return _model("TreeEnsembleRegressor", [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", targets])],
                  count, n_targets=targets, **entries, **attributes)


def _classifier(labels: list, names, count: int = 3, sign: float = 1.0, **attributes) -> onnx.ModelProto:
    strings = isinstance(labels[0], str)
    entries = _entries("class", count, names, seed=3, sign=sign)
    outputs = [helper.make_tensor_value_info("label", TensorProto.STRING if strings else TensorProto.INT64, ["N"]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", len(labels)])]
    return _model("TreeEnsembleClassifier", outputs, count, **entries, **attributes,
                  **{"classlabels_strings" if strings else "classlabels_int64s": labels})


def _x(n: int = 64, seed: int = 4) -> np.ndarray:
    return (rng(seed).integers(-5, 6, (n, FEATURES)) / 2).astype(np.float32)


def _every(classes: int):
    return lambda t, leaf: range(classes)


TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO")
CASES = {
    "regressor SUM, base value": lambda: _regressor(1, base_values=[0.5]),
    "regressor AVERAGE": lambda: _regressor(1, aggregate_function="AVERAGE"),
    "regressor of one target LOGISTIC (not applied)": lambda: _regressor(1, post_transform="LOGISTIC"),
    **{f"regressor of 3 targets {t}": (lambda t=t: _regressor(3, post_transform=t, base_values=[0.1, -0.2, 0.3]))
       for t in TRANSFORMS},
    "regressor of 3 targets AVERAGE": lambda: _regressor(3, aggregate_function="AVERAGE", base_values=[1.0, 2, 3]),
    "regressor with a target no leaf names": lambda: _regressor(3, lambda t, leaf: (0, 1), base_values=[1.0, 2, 3],
                                                                post_transform="SOFTMAX_ZERO"),
    "regressor with two weights at a leaf and target": lambda: _regressor(2, lambda t, leaf: (0, 1, 1)),
    "regressor of mixed modes and missing tracks": lambda: _model(
        "TreeEnsembleRegressor", [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], n_targets=1,
        **_trees(4, 5, ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"), True),
        **_entries("target", 4, lambda t, leaf: (0,), 6, sign=0)),
    **{f"forest of 4 classes {t}": (lambda t=t: _classifier([2, 4, 6, 8], _every(4), post_transform=t))
       for t in ("NONE", "SOFTMAX_ZERO")},
    **{f"boosted, a tree per class {t}": (lambda t=t: _classifier(
        [0, 1, 2], lambda tree, leaf: (tree % 3,), count=6, sign=0, post_transform=t, base_values=[0.1, 0.2, 0.3]))
       for t in ("SOFTMAX", "LOGISTIC")},
    "string labels": lambda: _classifier(["cat", "dog", "eel"], _every(3), post_transform="SOFTMAX"),
    **{f"binary naming {named}, {len(base or [])} base values, {'positive' if sign > 0 else 'mixed'}, {t}":
       (lambda named=named, base=base, sign=sign, t=t: _classifier(
           [3, 7], lambda tree, leaf: named, sign=sign, post_transform=t, **({"base_values": base} if base else {})))
       for named, base, sign, t in itertools.product([(0,), (1,), (0, 1)], [None, [0.3], [0.2, 0.4]], [1, 0],
                                                     TRANSFORMS)},
    "binary string labels naming both": lambda: _classifier(["no", "yes"], _every(2), post_transform="LOGISTIC"),
}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(model.SerializeToString())


def _assert_same(want: dict, got: dict) -> None:
    for name in want:
        if want[name].dtype.kind in "iOU":
            assert (want[name] == got[name]).all(), name
        else:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", CASES)
def test_the_lowered_model_computes_what_onnx_runtime_computes(case) -> None:
    model = CASES[case]()
    low = _copy(model)
    made = lower(low)
    onnx.checker.check_model(low, full_check=True)
    ml = [n for n in low.graph.node if n.domain == "ai.onnx.ml"]
    assert [n.op_type for n in ml] == ["TreeEnsembleRegressor"]  # the indicator: weights 1, summed
    assert {a.name: helper.get_attribute_value(a) for a in ml[0].attribute}.keys() >= {"nodes_modes", "n_targets"}
    assert set(helper.get_attribute_value(next(a for a in ml[0].attribute if a.name == "target_weights"))) == {1.0}
    assert sorted(made) == sorted(t.name for t in low.graph.initializer)
    assert made[0] in ("trees.target_weights", "trees.class_weights")
    x = _x()
    if "missing" in case:
        x[::5, 1] = np.nan
    names = [o.name for o in model.graph.output]
    _assert_same(ort_run(model, {"x": x}, names), ort_run(low, {"x": x}, names))


def test_forms_it_does_not_know_stay_as_they_are() -> None:
    weights = _entries("target", 3, lambda t, leaf: (0,), 2)["target_weights"]
    unknown = [_regressor(1, aggregate_function="MIN"), _regressor(1, aggregate_function="MAX"),
               _regressor(2, post_transform="PROBIT"),
               _regressor(1, lambda t, leaf: (0, 0)),  # one target, two weights at a leaf: ONNX Runtime keeps one
               _regressor(2, lambda t, leaf: (0,) if leaf % 2 else (0, 1)),  # target 1 scored in some rows
               _classifier([5], _every(1)),
               _classifier([0, 1, 2], lambda t, leaf: (0, 1)),  # class 2 never scored, no base value for it
               _classifier([0, 1], _every(2), post_transform="PROBIT")]
    tensors = _regressor(1)
    node = tensors.graph.node[0]
    node.attribute.remove(next(a for a in node.attribute if a.name == "target_weights"))
    node.attribute.append(helper.make_attribute("target_weights_as_tensor", numpy_helper.from_array(
        np.asarray(weights, np.float64))))
    tensors.opset_import[1].version = 3
    for model in [*unknown, tensors]:
        before = model.SerializeToString()
        assert lower(model) == []
        assert model.SerializeToString() == before


@pytest.mark.parametrize("case", ["regressor of 3 targets SOFTMAX_ZERO", "regressor of 3 targets AVERAGE",
                                  "regressor with two weights at a leaf and target",
                                  "boosted, a tree per class SOFTMAX",
                                  "binary naming (0,), 1 base values, positive, NONE",
                                  "binary naming (0, 1), 2 base values, mixed, LOGISTIC"])
def test_gradients_of_the_leaf_values_match_finite_differences(case) -> None:
    model = CASES[case]()
    lower(model)
    if model.graph.output[0].name == "label":
        model.graph.output.pop(0)
    feeds = {"x": _x()}
    directional_check(with_loss(model, feeds), feeds, sorted(t.name for t in model.graph.initializer))


@pytest.mark.parametrize("case", ["regressor of 3 targets LOGISTIC", "regressor with two weights at a leaf and target",
                                  "forest of 4 classes SOFTMAX_ZERO", "boosted, a tree per class LOGISTIC",
                                  "binary naming (0,), 0 base values, positive, NONE",
                                  "binary naming (1,), 2 base values, positive, SOFTMAX"])
def test_weights_written_back_compute_what_the_lowered_graph_computes(case) -> None:
    """Perturbed weights (some positive ones turned negative: the binary rules read their signs)
    give the same outputs lowered and written back into the original node."""
    model = CASES[case]()
    low = _copy(model)
    lower(low)
    trained = {}
    for tensor in low.graph.initializer:
        array = numpy_helper.to_array(tensor)
        trained[tensor.name] = (array + rng(7).normal(0, 0.3, array.shape)).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(trained[tensor.name], tensor.name))
    before = [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    write_back(model, trained)
    assert [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == before
    names = [o.name for o in model.graph.output]
    _assert_same(ort_run(model, {"x": _x()}, names), ort_run(low, {"x": _x()}, names))


def test_train_writes_the_trained_leaf_values_back_into_the_attributes(tmp_path) -> None:
    model = _regressor(1, count=4, base_values=[0.5])
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "t.onnx"
    onnx.save(model, path)
    x = _x(64)
    target = (x[:, :1] > 0).astype(np.float32) - x[:, 1:2] / 4
    np.savez(data, x=x, labels=target)
    assert main(["train", str(path), "--data", str(data), "--loss", "mse", "--output", "y", "--epochs", "20",
                 "--lr", "0.05", "--precision", "float32", "-o", str(out), "--quiet"]) == 0
    trained = onnx.load(out)
    assert [(n.name, n.op_type, list(n.input), list(n.output)) for n in trained.graph.node] == \
        [(n.name, n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    before, after = ({a.name: helper.get_attribute_value(a) for a in m.graph.node[0].attribute}
                     for m in (model, trained))
    assert before["target_weights"] != after["target_weights"] and before["base_values"] != after["base_values"]
    assert {k: v for k, v in before.items() if k.startswith("nodes_")} == \
        {k: v for k, v in after.items() if k.startswith("nodes_")}

    def mse(m):
        return np.mean((ort_run(m, {"x": x}, ["y"])["y"] - target) ** 2)

    assert mse(trained) < 0.8 * mse(model)
