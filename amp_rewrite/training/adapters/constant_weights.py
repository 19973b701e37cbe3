"""Weights held in Constant nodes (paddle2onnx writes every weight so; tf2onnx and hand-written
graphs often do) or made by ConstantOfShape of a constant shape (onnx's light models hold every
weight and BatchNormalization statistic so) train as initializers do, and go back into their
nodes on export.

``lower`` turns each top-level node of either kind whose value is a float tensor of at least
``MIN_ELEMENTS`` elements into an initializer named as its output (the step sees weights one
way); a scalar (an epsilon, a scale), every integer tensor (shapes, indices, axes) and a
ConstantOfShape whose shape is computed at run time stay nodes. ``write_back`` puts trained
values into the nodes of the original graph, same node names, same outputs (a ConstantOfShape
becomes a Constant holding its trained tensor): the trained model is the input model with new
weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.tensors import constant_tensor, read_array

MIN_ELEMENTS = 2
"""The fewest elements of a Constant's float tensor that make it a weight: scalars are not."""


_MADE_BY = ("Constant", "ConstantOfShape")
"""The ops whose output is a weight when its value is known without running the model."""


def _made_tensor(node: onnx.NodeProto, shapes: Mapping[str, onnx.TensorProto]) -> onnx.TensorProto | None:
    """The tensor a Constant node holds, or a ConstantOfShape makes from a shape in ``shapes``."""
    if node.op_type not in _MADE_BY or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Constant":
        return constant_tensor(node)
    if node.input[0] not in shapes:
        return None
    fill = _fill(node)
    dims = read_array(shapes[node.input[0]], None).astype(np.int64).tolist()
    return numpy_helper.from_array(np.full(dims, fill.reshape(()), fill.dtype))


def _fill(node: onnx.NodeProto) -> np.ndarray:
    """A ConstantOfShape's one-element value (float32 zero when it names none)."""
    return next((read_array(a.t, None) for a in node.attribute if a.name == "value"), np.zeros(1, np.float32))


def lower(model: onnx.ModelProto) -> list[str]:
    """Turn the model's top-level weights in Constant and ConstantOfShape nodes into initializers
    (in place); their names."""
    graph = model.graph
    shapes: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
    kept, lifted = [], []
    for node in graph.node:
        tensor = _made_tensor(node, shapes)
        if node.op_type == "Constant" and tensor is not None:
            shapes[node.output[0]] = tensor
        if tensor is None or tensor.data_type not in FLOAT_TYPES or int(np.prod(tensor.dims)) < MIN_ELEMENTS:
            kept.append(node)
            continue
        weight = onnx.TensorProto()
        weight.CopyFrom(tensor)
        weight.name = node.output[0]
        graph.initializer.append(weight)
        if model.ir_version < 4:  # where every initializer is a graph input too
            graph.input.append(onnx.helper.make_tensor_value_info(weight.name, weight.data_type, list(weight.dims)))
        lifted.append(weight.name)
    if lifted:
        del graph.node[:]
        graph.node.extend(kept)
    return lifted


def write_back(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> None:
    """Put ``weights`` (by output name) into the top-level Constant nodes of ``model`` that make
    them (in place), in each tensor's own type; a ConstantOfShape that makes one becomes a
    Constant node of its name and output holding it. An Identity of an initializer that makes one
    (TorchScript's shared copy of equal BatchNormalization statistics, each BN's own once
    trained) becomes a Constant node of that name and output holding it."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        made = node.output and node.output[0] in weights and (
            node.op_type == "Identity" and node.input[0] in initializers or node.op_type == "ConstantOfShape")
        if made:
            dtype = read_array(initializers[node.input[0]], None).dtype if node.op_type == "Identity" else \
                _fill(node).dtype
            node.op_type = "Constant"
            del node.input[:]
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(
                weights[node.output[0]].astype(dtype))))
            continue
        if node.op_type != "Constant" or not node.output or node.output[0] not in weights:
            continue
        for attribute in node.attribute:
            if attribute.name == "value":
                trained = weights[node.output[0]].astype(read_array(attribute.t, None).dtype)
                attribute.t.CopyFrom(numpy_helper.from_array(trained, attribute.t.name))
