"""Written-out RMSNorms as exporters write them (Llama, T5, Qwen2, Gemma before opset 23's
RMSNormalization): ``x * 1/sqrt(mean(x * x) + eps)`` or ``x / sqrt(mean(x * x) + eps)``, the
square a ``Pow(x, 2)`` or a ``Mul(x, x)``, the root's inverse a ``Reciprocal`` or a ``Div(1, _)``.
"""

from __future__ import annotations

import numpy as np

from amp_rewrite.ir.graph import Node, ValueKey
from amp_rewrite.ir.tensors import read_array
from amp_rewrite.rewrite.analysis import Analysis


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
    mean = producer(analysis, key, "ReduceMean")
    return None if mean is None else _squared(analysis, mean)


def _squared(analysis: Analysis, mean: Node) -> ValueKey | None:
    """``mean_square_of`` for the ReduceMean node ``mean``."""
    square = producer(analysis, mean.inputs[0], "Pow", "Mul")
    if square is None or len(square.inputs) != 2:
        return None
    if square.op_type == "Pow" and scalar(analysis, square.inputs[1]) != 2.0:
        return None
    if square.op_type == "Mul" and square.inputs[0] != square.inputs[1]:
        return None
    x = square.inputs[0]
    centred = producer(analysis, x, "Sub")
    if centred is not None and producer(analysis, centred.inputs[1], "ReduceMean") is not None:
        return None
    return x


def rms_of(analysis: Analysis, key: ValueKey | None) -> ValueKey | None:
    """The ``x`` of ``key = Sqrt(mean square of x + eps)`` with a constant ``eps >= 0`` and the
    mean's reduced axes kept (so that it broadcasts against ``x``), or None."""
    root = producer(analysis, key, "Sqrt")
    add = producer(analysis, root.inputs[0], "Add") if root is not None else None
    if add is None or len(add.inputs) != 2:
        return None
    for at in (0, 1):
        epsilon = scalar(analysis, add.inputs[1 - at])
        mean = producer(analysis, add.inputs[at], "ReduceMean")
        if (epsilon is not None and epsilon >= 0 and mean is not None
                and not any(a.name == "keepdims" and a.i == 0 for a in mean.proto.attribute)):
            return _squared(analysis, mean)
    return None


def normalizes(analysis: Analysis, node: Node) -> bool:
    """Whether ``node`` divides an ``x`` by its own RMS (``rms_of``): ``Div(x, rms)``, or
    ``Mul`` of ``x`` and ``Reciprocal(rms)`` or ``Div(1, rms)``. Each element of its output is
    at most the square root of the reduced extent in magnitude, whatever ``x`` holds."""
    if node.domain != "" or len(node.inputs) != 2:
        return False
    if node.op_type == "Div":
        return node.inputs[0] is not None and rms_of(analysis, node.inputs[1]) == node.inputs[0]
    if node.op_type != "Mul":
        return False
    for at in (0, 1):
        inverse = producer(analysis, node.inputs[1 - at], "Reciprocal", "Div")
        if inverse is None or (inverse.op_type == "Div" and scalar(analysis, inverse.inputs[0]) != 1.0):
            continue
        if node.inputs[at] is not None and rms_of(analysis, inverse.inputs[-1]) == node.inputs[at]:
            return True
    return False
