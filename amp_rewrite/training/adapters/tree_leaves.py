"""Tree ensembles whose leaf values train: ai.onnx.ml's TreeEnsembleRegressor / Classifier lowered.

Given the path each row takes, a tree ensemble's scores are linear in its leaf values: the
thresholds pick one leaf per tree (no gradient there), and the picked leaves' weights are summed.
``regressor`` and ``classifier`` (lowerings for ``attribute_weights``) compute a node as

1. an indicator: a TreeEnsembleRegressor with the node's own ``nodes_*`` attributes (the same
   traversal, missing-value tracks included) and one target per leaf that holds weights, each of
   weight 1, summed, no base values: [N, leaves], 1 where a row reaches the leaf, else 0;
2. times the leaf values [leaves, targets], gathered from the weights (``<node>.target_weights`` /
   ``<node>.class_weights``, the attribute's entries in its order; entries of one leaf and target
   add up, as in ONNX Runtime);
3. then ONNX Runtime's finish: the mean over trees (AVERAGE), the base values, the post-transform,
   a classifier's label, and its binary case, whose rules (one score or two, the 0.5 threshold
   when all weights are positive, an unscored class written as 0) come from ONNX Runtime's
   ``tree_ensemble_aggregator.h`` and are checked against it by the tests.

Invariant: a lowered node computes what ONNX Runtime computes on the original node, for any
weights. A node whose result depends on what a lowering does not model stays as it is (None):
a MIN or MAX aggregate, a PROBIT post-transform, ``*_as_tensor`` attributes, one target with
several weights on a leaf (ONNX Runtime keeps one), a class or target scored in some rows only
(ONNX Runtime writes an unscored one as 0 and ranks it apart), a one-class classifier.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_rewrite.ir.builder import GraphBuilder

REGRESSOR_WEIGHTS = ("target_weights", "base_values")
CLASSIFIER_WEIGHTS = ("class_weights", "base_values")
"""The attributes each op's lowering trains (its weights are named ``<node>.<attribute>``)."""
AVERAGED = {"SUM": False, "AVERAGE": True}
"""The aggregates that are linear in the leaf values, and whether each divides by the tree count."""
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO")
"""The post-transforms lowered (PROBIT's inverse erf is ONNX Runtime's own approximation)."""
ZERO_BAND = 1e-7
"""SOFTMAX_ZERO leaves out of the sum the scores within this distance of 0 (ONNX Runtime's bound)."""


class _Ensemble:
    """A tree ensemble node's weight entries: the leaf (indicator column) and target of each, and
    whether every row scores each target."""

    def __init__(self, node: onnx.NodeProto, attributes: dict, prefix: str, targets: int) -> None:
        self.node, self.targets = node, targets
        self.weights = np.asarray(attributes.get(f"{prefix}_weights", []), np.float32)
        self.bias = np.asarray(attributes.get("base_values", []), np.float32)
        self.ids = list(attributes.get(f"{prefix}_ids", []))
        trees = attributes.get("nodes_treeids", [])
        self.n_trees = len(set(trees))
        by_tree: dict[int, set] = {}
        for t, n, mode in zip(trees, attributes.get("nodes_nodeids", []), attributes.get("nodes_modes", [])):
            if mode == b"LEAF":
                by_tree.setdefault(t, set()).add((t, n))
        entries = list(zip(attributes.get(f"{prefix}_treeids", []), attributes.get(f"{prefix}_nodeids", [])))
        # ONNX Runtime ignores the entries of a node that is not a leaf: they get no column (-1)
        self.leaves = list(dict.fromkeys(e for e in entries if e in by_tree.get(e[0], ())))
        column = {leaf: i for i, leaf in enumerate(self.leaves)}
        self.columns = [column.get(e, -1) for e in entries]
        self.scored = [self._scored(c, by_tree) for c in range(targets)]

    def _scored(self, target: int, by_tree: dict[int, set]) -> str | None:
        """"always" where some tree names ``target`` at every leaf, "never" where no leaf names it,
        else None (it depends on the row)."""
        named = {self.leaves[col] for col, i in zip(self.columns, self.ids) if col >= 0 and i == target}
        if not named:
            return "never"
        return "always" if any(leaves <= named for leaves in by_tree.values()) else None

    def valid(self) -> bool:
        """Every entry has a weight and names a target, some sit at leaves, and every target is
        scored in all rows or in none."""
        return (len(self.weights) == len(self.ids) == len(self.columns) and bool(self.leaves)
                and None not in self.scored and all(0 <= i < self.targets for i in self.ids))

    def scores(self, b: GraphBuilder, weights: str) -> str:
        """[N, targets]: the sums of the weights (the value ``weights``) of the leaves each row reaches."""
        count = len(self.leaves)
        indicator = b.op("TreeEnsembleRegressor", self.node.input[0], domain=self.node.domain, n_targets=count,
                         target_treeids=[t for t, _ in self.leaves], target_nodeids=[n for _, n in self.leaves],
                         target_ids=list(range(count)), target_weights=[1.0] * count, aggregate_function="SUM",
                         post_transform="NONE")
        b.made_by[indicator].attribute.extend(a for a in self.node.attribute if a.name.startswith("nodes_"))
        pad = len(self.weights)  # the index of a zero after the weights: a slot no entry fills
        layers: list[np.ndarray] = []  # several entries of one leaf and target: one layer each, summed
        for entry, (col, target) in enumerate(zip(self.columns, self.ids)):
            if col < 0:
                continue
            slot = col * self.targets + target
            layer = next((layer for layer in layers if layer[slot] == pad), None)
            if layer is None:
                layer = np.full(count * self.targets, pad, np.int64)
                layers.append(layer)
            layer[slot] = entry
        padded = b.op("Concat", weights, b.const(np.zeros(1, np.float32)), axis=0)
        parts = [b.op("Gather", padded, b.const(layer)) for layer in layers]
        values = b.op("Reshape", parts[0] if len(parts) == 1 else b.op("Sum", *parts), b.ints([count, self.targets]))
        # ml opset 1 infers neither its type nor its rank: a Cast and a Reshape state them
        rows = b.op("Reshape", b.op("Cast", indicator, to=TensorProto.FLOAT), b.ints([-1, count]))
        return b.op("MatMul", rows, values)


def _attributes(node: onnx.NodeProto) -> dict | None:
    """The node's attributes by name, or None where weights or thresholds are given as tensors."""
    if any(a.name.endswith("_as_tensor") for a in node.attribute):
        return None
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _transformed(b: GraphBuilder, scores: str, transform: str, out: str) -> None:
    """``out`` = the post-transform of the rows of ``scores`` ([N, 2 or more])."""
    if transform != "SOFTMAX_ZERO":
        op = {"NONE": "Identity", "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}[transform]
        b.op(op, scores, outputs=[out], axis=1 if op == "Softmax" else None)
        return
    top = b.axes_op("ReduceMax", scores, [1], keepdims=1)
    kept = b.op("Greater", b.op("Abs", scores), b.const(ZERO_BAND))
    small = b.op("Mul", scores, b.op("Exp", b.op("Neg", top)))
    spread = b.op("Where", kept, b.op("Exp", b.op("Sub", scores, top)), small)
    b.op("Div", spread, b.reduce_sum(b.op("Where", kept, spread, b.const(0.0)), [1]), outputs=[out])


def regressor(b: GraphBuilder, node: onnx.NodeProto, base: str) -> dict[str, np.ndarray] | None:
    """TreeEnsembleRegressor: the leaf sums (over the trees' count for AVERAGE) plus the base
    values, post-transformed; with one target ONNX Runtime applies no post-transform but PROBIT."""
    attributes = _attributes(node)
    if attributes is None:
        return None
    targets = attributes.get("n_targets", 0)
    aggregate = attributes.get("aggregate_function", b"SUM").decode()
    transform = attributes.get("post_transform", b"NONE").decode()
    ensemble = _Ensemble(node, attributes, "target", targets)
    placed = sum(col >= 0 for col in ensemble.columns)
    if (aggregate not in AVERAGED or transform not in TRANSFORMS or not ensemble.valid()
            or len(ensemble.bias) not in (0, targets) or targets == 1 and placed > len(ensemble.leaves)):
        return None
    weights = {f"{base}.target_weights": ensemble.weights}
    scores = ensemble.scores(b, f"{base}.target_weights")
    if AVERAGED[aggregate]:
        scores = b.op("Div", scores, b.const(np.float32(ensemble.n_trees)))
    if len(ensemble.bias):
        weights[f"{base}.base_values"] = ensemble.bias
        # ONNX Runtime writes a target no leaf names as 0, its base value left out
        kept = np.asarray([s == "always" for s in ensemble.scored], np.float32)
        added = f"{base}.base_values" if kept.all() else b.op("Mul", f"{base}.base_values", b.const(kept))
        scores = b.op("Add", scores, added)
    if targets == 1:
        b.op("Identity", scores, outputs=[node.output[0]])
    else:
        _transformed(b, scores, transform, node.output[0])
    return weights


def classifier(b: GraphBuilder, node: onnx.NodeProto, base: str) -> dict[str, np.ndarray] | None:
    """TreeEnsembleClassifier (always a sum): over three classes or more, the label of the highest
    score and the post-transformed scores; with two, ONNX Runtime's binary case (``_binary``)."""
    attributes = _attributes(node)
    if attributes is None:
        return None
    strings = list(attributes.get("classlabels_strings") or [])
    labels = strings or list(attributes.get("classlabels_int64s") or [])
    transform = attributes.get("post_transform", b"NONE").decode()
    ensemble = _Ensemble(node, attributes, "class", len(labels))
    bias, one_id = len(ensemble.bias), len(set(ensemble.ids)) == 1
    if len(labels) < 2 or transform not in TRANSFORMS or not ensemble.valid():
        return None
    if len(labels) > 2 and (bias not in (0, len(labels)) or not bias and "never" in ensemble.scored):
        return None  # ONNX Runtime ranks a class without a score apart
    if len(labels) == 2 and (bias > 2 or bias == 1 and ensemble.scored[1] == "never" and not one_id):
        return None  # one score per row, and no rule for the second column
    weights = {f"{base}.class_weights": ensemble.weights}
    if bias:
        weights[f"{base}.base_values"] = ensemble.bias
    scores = ensemble.scores(b, f"{base}.class_weights")
    if len(labels) == 2 and not one_id and not strings:
        labels = [0, 1]  # ONNX Runtime's label is then the index itself
    table = b.const(np.asarray(labels, object if strings else np.int64),
                    elem_type=TensorProto.STRING if strings else TensorProto.INT64)
    if len(labels) == 2:
        _binary(b, node, ensemble, scores, table, transform, base)
        return weights
    if bias:
        scores = b.op("Add", scores, f"{base}.base_values")
    b.op("Gather", table, b.op("ArgMax", scores, axis=1, keepdims=0), outputs=[node.output[0]])
    if len(node.output) > 1 and node.output[1]:
        _transformed(b, scores, transform, node.output[1])
    return weights


def _binary(b: GraphBuilder, node: onnx.NodeProto, ensemble: _Ensemble, sums: str, table: str, transform: str,
            base: str) -> None:
    """ONNX Runtime's two classes, from the sums s0, s1. Base values: two with class 1 scored make
    the scores [-(b1 + s0), b1 + s0]; two without, [s0 + b0, s1 + b1]; one adds b0 to s0. A class
    no leaf scores is written as 0. The label: class 1 where the positive score (class 1's where
    scored, else class 0's) exceeds 0, or 0.5 when the weights name one class id and are all
    positive. Without two base values or class 1 scored, one score s remains, written [1 - s, s]
    (one class id, all weights positive) or [-s, s]; a LOGISTIC post-transform makes either
    [sigmoid(-s), sigmoid(s)]."""
    always = [s == "always" for s in ensemble.scored]
    s0, s1 = (b.op("Gather", sums, b.ints([c]), axis=1) for c in (0, 1))
    bias = [b.op("Gather", f"{base}.base_values", b.const(np.int64(k)), axis=0) for k in range(len(ensemble.bias))]
    p0, p1 = s0, s1
    if len(bias) == 2 and always[1]:
        p1 = b.op("Add", bias[1], s0)
        p0 = b.op("Neg", p1)
    elif bias:
        p0 = b.op("Add", s0, bias[0])
        p1 = b.op("Add", s1, bias[1]) if len(bias) == 2 else s1
    z0, z1 = (p0 if always[0] else s0), (p1 if always[1] else s1)  # an unscored class's sum is 0
    positive = z1 if always[1] else z0
    if len(set(ensemble.ids)) == 1:
        all_positive = b.op("GreaterOrEqual", b.axes_op("ReduceMin", f"{base}.class_weights", None, keepdims=0),
                            b.const(0.0))
        threshold = b.op("Where", all_positive, b.const(0.5), b.const(0.0))
    else:
        all_positive, threshold = None, b.const(0.0)
    index = b.op("Cast", b.op("Greater", positive, threshold), to=TensorProto.INT64)
    b.op("Gather", table, b.op("Reshape", index, b.ints([-1])), outputs=[node.output[0]])
    if len(node.output) < 2 or not node.output[1]:
        return
    if len(bias) == 2 or always[1]:
        _transformed(b, b.op("Concat", z0, z1, axis=1), transform, node.output[1])
    elif transform == "LOGISTIC":
        b.op("Concat", b.op("Sigmoid", b.op("Neg", z0)), b.op("Sigmoid", z0), axis=1, outputs=[node.output[1]])
    else:
        negative = b.op("Neg", z0)
        if all_positive is not None:
            negative = b.op("Where", all_positive, b.op("Sub", b.const(1.0), z0), negative)
        b.op("Concat", negative, z0, axis=1, outputs=[node.output[1]])
