"""Weights held in op attributes: ai.onnx.ml's linear models and tree ensembles train.

scikit-learn's converters write a logistic regression or a ridge as ai.onnx.ml's
LinearClassifier / LinearRegressor, whose coefficients and intercepts are attributes, and
often follow it with a Normalizer; a forest or a boosted ensemble (scikit-learn, XGBoost,
LightGBM) as TreeEnsembleRegressor / TreeEnsembleClassifier, whose leaf values are attributes
(``tree_leaves``); none of them has a gradient. ``lower`` rewrites each top-level node of
those ops (in place) into standard ops computing what ONNX Runtime's kernel computes, with the
weights as float32 initializers named ``<node>.<attribute>`` (``<node>``: the node's name, else
its first output), so they train as any weight does. ``write_back`` puts trained values into
the attributes of the original nodes: the trained model is the input model with new weights.

Invariant: after ``lower``, no node of those ops of a form its lowering knows remains at the
top level, every output keeps its name and meaning, and each lowered node's weights are
initializers named after the attributes its ``Lowering`` trains; a form it does not know (a
PROBIT post-transform, a linear classifier's SOFTMAX_ZERO or missing intercepts, a MIN
aggregate) stays as it is and is refused where a gradient must pass through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.ir.builder import GraphBuilder, Names
from amp_rewrite.training.adapters import tree_leaves

ML_DOMAIN = "ai.onnx.ml"
COEFFICIENTS, INTERCEPTS = "coefficients", "intercepts"
"""The attributes that hold the weights, and the suffixes of their initializers' names."""
SCORE_TRANSFORMS = {"NONE": None, "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}
"""The post-transforms of several scores per row a lowered node applies, as the op doing it."""
NORMS = {"L1": ("Abs", "ReduceSum"), "L2": ("Mul", "ReduceSum"), "MAX": (None, "ReduceMax")}
"""Normalizer's norms: the op applied elementwise (Mul: a square) and the row reduction."""


def lower(model: onnx.ModelProto) -> list[str]:
    """Rewrite the top-level linear models and Normalizers of ``model`` into standard ops (in
    place); the names of the initializers made (see the module's docstring)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13 or not any(n.domain == ML_DOMAIN and n.op_type in _LOWERINGS for n in graph.node):
        return []  # Softmax over one axis, ReduceSum's axes input: opset 13 on
    names = Names.of_model(model)
    kept: list[onnx.NodeProto] = []
    made: list[str] = []
    for node in graph.node:
        lowering = _LOWERINGS.get(node.op_type) if node.domain == ML_DOMAIN else None
        b = GraphBuilder(names, opset, prefix=f"{_base(node)}/")
        weights = lowering.lower(b, node, _base(node)) if lowering else None
        if weights is None:
            kept.append(node)
            continue
        kept.extend(b.nodes)
        for name, array in weights.items():
            graph.initializer.append(numpy_helper.from_array(array, name))
            made.append(name)
    del graph.node[:]
    graph.node.extend(kept)
    return made


def write_back(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> None:
    """Put trained ``weights`` (by the names ``lower`` gave) into the attributes of the
    top-level nodes they came from (in place): the float lists their ``Lowering`` trains."""
    for node in model.graph.node:
        trains = _LOWERINGS[node.op_type].trains if node.domain == ML_DOMAIN and node.op_type in _LOWERINGS else ()
        for attribute in node.attribute:
            trained = weights.get(f"{_base(node)}.{attribute.name}")
            if attribute.name in trains and trained is not None:
                del attribute.floats[:]
                attribute.floats.extend(np.asarray(trained, np.float32).ravel().tolist())


def _base(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _affine(b: GraphBuilder, node: onnx.NodeProto, base: str, rows: int) -> tuple[str, dict[str, np.ndarray]]:
    """X (as float32) times the coefficients ([rows, features]) transposed, plus the intercepts
    where the node has them: (the scores, the weights by initializer name)."""
    attributes = _attributes(node)
    coefficients = np.asarray(attributes[COEFFICIENTS], np.float32).reshape(rows, -1)
    weights = {f"{base}.{COEFFICIENTS}": coefficients}
    if attributes.get(INTERCEPTS):
        weights[f"{base}.{INTERCEPTS}"] = np.asarray(attributes[INTERCEPTS], np.float32)
    x = b.op("Cast", node.input[0], to=TensorProto.FLOAT)
    return b.op("Gemm", x, *weights, transB=1), weights


def _classifier(b: GraphBuilder, node: onnx.NodeProto, base: str) -> dict[str, np.ndarray] | None:
    """LinearClassifier: labels by the highest score (or, with one score per row and two class
    labels, the second where the score is positive); the scores post-transformed, or with one
    score per row and two class labels, [1 - p, p] of its post-transformed p (ONNX Runtime's
    binary case)."""
    attributes = _attributes(node)
    transform = attributes.get("post_transform", b"NONE").decode()
    intercepts = attributes.get(INTERCEPTS) or []
    classes = attributes.get("classlabels_ints") or list(attributes.get("classlabels_strings") or [])
    if not intercepts or transform not in SCORE_TRANSFORMS or len(intercepts) == 1 and transform == "SOFTMAX":
        return None
    raw, weights = _affine(b, node, base, len(intercepts))
    labels, scores = node.output[0], node.output[1] if len(node.output) > 1 else ""
    table = b.const(np.asarray(classes, object if attributes.get("classlabels_strings") else np.int64),
                    elem_type=TensorProto.STRING if attributes.get("classlabels_strings") else TensorProto.INT64)
    op = SCORE_TRANSFORMS[transform]
    if len(intercepts) == 1 and len(classes) == 2:
        positive = b.op("Cast", b.op("Greater", b.op("Squeeze", raw, b.ints([1])), b.const(0.0)), to=TensorProto.INT64)
        b.op("Gather", table, positive, outputs=[labels])
        if scores:
            p = b.op("Sigmoid", raw) if op == "Sigmoid" else raw
            b.op("Concat", b.op("Sub", b.const(1.0), p), p, axis=1, outputs=[scores])
        return weights
    b.op("Gather", table, b.op("ArgMax", raw, axis=1, keepdims=0), outputs=[labels])
    if scores:
        b.op(op or "Identity", raw, outputs=[scores], axis=1 if op == "Softmax" else None)
    return weights


def _regressor(b: GraphBuilder, node: onnx.NodeProto, base: str) -> dict[str, np.ndarray] | None:
    """LinearRegressor without a post-transform: X times the coefficients plus the intercepts."""
    attributes = _attributes(node)
    if attributes.get("post_transform", b"NONE").decode() != "NONE":
        return None
    raw, weights = _affine(b, node, base, int(attributes.get("targets", 1)))
    b.op("Identity", raw, outputs=[node.output[0]])
    return weights


def _normalizer(b: GraphBuilder, node: onnx.NodeProto, base: str) -> dict[str, np.ndarray] | None:
    """Normalizer: each row divided by its L1, L2 or max norm."""
    norm = _attributes(node).get("norm", b"MAX").decode()
    if norm not in NORMS:
        return None
    elementwise, reduction = NORMS[norm]
    x = b.op("Cast", node.input[0], to=TensorProto.FLOAT)
    terms = x if elementwise is None else b.op(elementwise, x, x) if elementwise == "Mul" else b.op(elementwise, x)
    total = b.axes_op(reduction, terms, [1], keepdims=1)
    b.op("Div", x, b.op("Sqrt", total) if norm == "L2" else total, outputs=[node.output[0]])
    return {}


class Lowering(NamedTuple):
    """One op's lowering: ``lower(builder, node, base)`` makes the nodes computing ``node``'s
    outputs and returns its weights by initializer name (``<base>.<attribute>``), or None to leave
    the node as it is; ``trains`` names the float-list attributes those weights hold."""

    lower: Callable[[GraphBuilder, onnx.NodeProto, str], dict[str, np.ndarray] | None]
    trains: tuple[str, ...] = ()


_LOWERINGS = {
    "LinearClassifier": Lowering(_classifier, (COEFFICIENTS, INTERCEPTS)),
    "LinearRegressor": Lowering(_regressor, (COEFFICIENTS, INTERCEPTS)),
    "Normalizer": Lowering(_normalizer),
    "TreeEnsembleRegressor": Lowering(tree_leaves.regressor, tree_leaves.REGRESSOR_WEIGHTS),
    "TreeEnsembleClassifier": Lowering(tree_leaves.classifier, tree_leaves.CLASSIFIER_WEIGHTS),
}
