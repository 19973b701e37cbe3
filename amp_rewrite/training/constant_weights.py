"""Weights held in Constant nodes (paddle2onnx writes every weight so; tf2onnx and hand-written
graphs often do) train as initializers do, and go back into their nodes on export.

``lift`` turns each top-level Constant node whose value is a float tensor of at least
``MIN_ELEMENTS`` elements into an initializer named as its output (the step sees weights one
way); a scalar (an epsilon, a scale) and every integer tensor (shapes, indices, axes) stay
nodes. ``written_back`` puts trained values into the Constant nodes of the original graph, same
node names, same outputs: the trained model is the input model with new weights.
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


def lift(model: onnx.ModelProto) -> list[str]:
    """Turn the model's top-level Constant-node weights into initializers (in place); their names."""
    graph = model.graph
    kept, lifted = [], []
    for node in graph.node:
        tensor = constant_tensor(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if tensor is None or tensor.data_type not in FLOAT_TYPES or int(np.prod(tensor.dims)) < MIN_ELEMENTS:
            kept.append(node)
            continue
        weight = onnx.TensorProto()
        weight.CopyFrom(tensor)
        weight.name = node.output[0]
        graph.initializer.append(weight)
        lifted.append(weight.name)
    if lifted:
        del graph.node[:]
        graph.node.extend(kept)
    return lifted


def written_back(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> None:
    """Put ``weights`` (by output name) into the top-level Constant nodes of ``model`` that make
    them (in place), in each tensor's own type. An Identity of an initializer that makes one
    (TorchScript's shared copy of equal BatchNormalization statistics, each BN's own once
    trained) becomes a Constant node of that name and output holding it."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Identity" and node.output and node.output[0] in weights and node.input[0] in initializers:
            value = numpy_helper.from_array(weights[node.output[0]].astype(
                read_array(initializers[node.input[0]], None).dtype))
            node.op_type = "Constant"
            del node.input[:]
            node.attribute.append(onnx.helper.make_attribute("value", value))
            continue
        if node.op_type != "Constant" or not node.output or node.output[0] not in weights:
            continue
        for attribute in node.attribute:
            if attribute.name == "value":
                trained = weights[node.output[0]].astype(read_array(attribute.t, None).dtype)
                attribute.t.CopyFrom(numpy_helper.from_array(trained, attribute.t.name))
