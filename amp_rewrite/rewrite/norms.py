"""Written-out norms as exporters write them. RMSNorms (Llama, T5, Qwen2, Gemma before opset 23's
RMSNormalization): ``x * 1/sqrt(mean(x * x) + eps)`` or ``x / sqrt(mean(x * x) + eps)``, the
square a ``Pow(x, 2)`` or a ``Mul(x, x)``, the root's inverse a ``Reciprocal`` or a ``Div(1, _)``.
LayerNorms (GPT-2, BERT and ViT exports before opset 17's LayerNormalization) scale the centred
``d = x - mean(x)`` so: ``d / sqrt(mean(d * d) + eps)``. The mean is a ReduceMean, or a
GlobalAveragePool where tf2onnx writes a ReduceMean over the last axes of a [batch, sequence,
hidden] tensor so (Keras's LayerNormalization: its ``moments/mean`` and ``moments/variance``).
"""

from __future__ import annotations

import numpy as np

from amp_rewrite.ir.graph import Node, ValueKey
from amp_rewrite.ir.tensors import read_array
from amp_rewrite.policy.oplists import DENY
from amp_rewrite.rewrite.analysis import Analysis

Use = tuple[int, int]
"""(node id, input index)"""

MEANS = ("ReduceMean", "GlobalAveragePool")
"""The ops a written-out norm takes its means with (GlobalAveragePool keeps the reduced axes)."""


def scalar(analysis: Analysis, key: ValueKey | None) -> float | None:
    """The value of a one-element float constant at ``key``, or None."""
    value = analysis.index.values.get(key) if key is not None else None
    if value is None or not analysis.is_float(value) or not analysis.is_offline(value):
        return None
    tensor = analysis.constant_of(value)
    if tensor is None or int(np.prod(tensor.dims)) != 1:
        return None
    return float(read_array(tensor, analysis.base_dir).reshape(-1)[0])


def producer(analysis: Analysis, key: ValueKey | None, *op_types: str) -> Node | None:
    """The node of one of ``op_types`` (default domain) that computes ``key``, or None."""
    value = analysis.index.values.get(key) if key is not None else None
    node = analysis.index.producer_node(value) if value is not None else None
    return node if node is not None and node.op_type in op_types and node.domain == "" else None


def mean_square_of(analysis: Analysis, key: ValueKey | None) -> ValueKey | None:
    """The ``x`` of ``key = ReduceMean(x * x)`` or ``ReduceMean(Pow(x, 2))`` where ``x`` is not
    mean-centred (``Sub(_, ReduceMean(_))``: a LayerNorm's), or None."""
    mean = producer(analysis, key, *MEANS)
    return None if mean is None else _squared(analysis, mean)


def _squared(analysis: Analysis, mean: Node, centred: bool = False) -> ValueKey | None:
    """``mean_square_of`` for the mean node ``mean``; ``centred``: a mean-centred ``x`` too."""
    square = producer(analysis, mean.inputs[0], "Pow", "Mul")
    if square is None or len(square.inputs) != 2:
        return None
    if square.op_type == "Pow" and scalar(analysis, square.inputs[1]) != 2.0:
        return None
    if square.op_type == "Mul" and square.inputs[0] != square.inputs[1]:
        return None
    x = square.inputs[0]
    if centred:
        return x
    sub = producer(analysis, x, "Sub")
    if sub is not None and producer(analysis, sub.inputs[1], *MEANS) is not None:
        return None
    return x


def pooled_statistic(analysis: Analysis, node: Node) -> str | None:
    """What a GlobalAveragePool computes of a written-out norm (``MEANS``): ``"mean square"``
    where it averages a square (``Mul(d, d)``, ``Pow(d, 2)``), ``"mean"`` where its own input is
    centred by it (``Sub(x, mean)``), else None (pooling, as a CNN's head pools)."""
    if node.op_type != "GlobalAveragePool" or node.domain != "" or not node.inputs or not node.outputs:
        return None
    if _squared(analysis, node, centred=True) is not None:
        return "mean square"
    index = analysis.index
    for reader_id, at in index.value(node.outputs[0]).uses:
        reader = index.nodes[reader_id]
        if reader.op_type == "Sub" and reader.domain == "" and at == 1 and reader.inputs[0] == node.inputs[0]:
            return "mean"
    return None


def rms_of(analysis: Analysis, key: ValueKey | None, centred: bool = False) -> ValueKey | None:
    """The ``x`` of ``key = Sqrt(mean square of x + eps)`` with a constant ``eps >= 0`` and the
    mean's reduced axes kept (so that it broadcasts against ``x``), or None. ``centred``: ``x``
    may be mean-centred (a LayerNorm's)."""
    root = producer(analysis, key, "Sqrt")
    add = producer(analysis, root.inputs[0], "Add") if root is not None else None
    if add is None or len(add.inputs) != 2:
        return None
    for at in (0, 1):
        epsilon = scalar(analysis, add.inputs[1 - at])
        mean = producer(analysis, add.inputs[at], *MEANS)
        if (epsilon is not None and epsilon >= 0 and mean is not None
                and not any(a.name == "keepdims" and a.i == 0 for a in mean.proto.attribute)):
            return _squared(analysis, mean, centred)
    return None


def normalizes(analysis: Analysis, node: Node, centred: bool = False) -> bool:
    """Whether ``node`` divides an ``x`` by its own RMS (``rms_of``): ``Div(x, rms)``, or
    ``Mul`` of ``x`` and ``Reciprocal(rms)`` or ``Div(1, rms)``. Each element of its output is
    at most the square root of the reduced extent in magnitude, whatever ``x`` holds (``x_i^2``
    is one of the terms of its own mean square). ``centred``: a LayerNorm's ``Div(d, rms)`` of
    the centred ``d`` counts too."""
    if node.domain != "" or len(node.inputs) != 2:
        return False
    if node.op_type == "Div":
        return node.inputs[0] is not None and rms_of(analysis, node.inputs[1], centred) == node.inputs[0]
    if node.op_type != "Mul":
        return False
    for at in (0, 1):
        inverse = producer(analysis, node.inputs[1 - at], "Reciprocal", "Div")
        if inverse is None or (inverse.op_type == "Div" and scalar(analysis, inverse.inputs[0]) != 1.0):
            continue
        if node.inputs[at] is not None and rms_of(analysis, inverse.inputs[-1], centred) == node.inputs[at]:
            return True
    return False


def layer_norms_end_regions(analysis: Analysis) -> bool:
    """Whether a written-out LayerNorm's scaling ends the float32 region of its statistics: where
    the policy runs LayerNormalization itself low (its kernel takes a low input, as the
    written-out norm then does, and computes the statistics in float32)."""
    layer_norm = analysis.policy.classify("", "LayerNormalization")
    return layer_norm is not None and layer_norm.name != DENY


def fused_layer_norm_reads(analysis: Analysis) -> dict[Use, Use | None]:
    """The reads that ONNX Runtime's LayerNormFusion takes into one LayerNormalization, for each
    written-out LayerNorm ``Add(Mul(Div(d, rms(d)), scale), bias)`` of ``d = Sub(x, ReduceMean(x))``
    (scale and bias one-dimensional constants): the statistics' reads of ``x`` map to the weight's read of the
    scaling (the fused norm reads ``x`` in the weight's precision), and that read maps to None
    (inside the fused norm). Its Casts are fused too where ``x``, scale and bias share a type."""
    index, found = analysis.index, dict[Use, Use | None]()
    for div in index.nodes:
        if div.op_type != "Div" or div.domain != "" or not normalizes(analysis, div, centred=True):
            continue
        sub = producer(analysis, div.inputs[0], "Sub")
        mean = producer(analysis, sub.inputs[1], "ReduceMean") if sub is not None else None
        if sub is None or mean is None or mean.inputs[0] != sub.inputs[0]:
            continue
        mul = _affine_reader(analysis, div.outputs[0], "Mul")
        add = _affine_reader(analysis, mul[0].outputs[0], "Add") if mul is not None else None
        if mul is None or add is None:
            continue
        weight = (mul[0].id, mul[1])
        found[(mean.id, 0)] = found[(sub.id, 0)] = weight
        found[weight] = None
    return found


def _affine_reader(analysis: Analysis, key: ValueKey | None, op_type: str) -> tuple[Node, int] | None:
    """(the node, the input it reads ``key`` at) where ``key``'s one reader is an ``op_type`` of
    it and a one-dimensional constant (as LayerNormFusion takes a weight or bias), else None."""
    value = analysis.index.values.get(key) if key is not None else None
    if value is None or len(value.uses) != 1 or value.output_of:
        return None
    node_id, at = value.uses[0]
    node = analysis.index.nodes[node_id]
    if node.op_type != op_type or node.domain != "" or len(node.inputs) != 2:
        return None
    other = analysis.index.values.get(read) if (read := node.inputs[1 - at]) is not None else None
    if other is None or not analysis.is_offline(other) or other.shape is None or len(other.shape) != 1:
        return None
    return node, at
