"""Element counts of values, for the cost of a cast; shapes the model lacks are inferred."""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
from onnx import AttributeProto

from amp_rewrite.ir.graph import ModelIndex, TensorType, Value, tensor_type

SYMBOLIC_DIM = 64
"""Assumed extent of a dimension with no known value (a batch or sequence length)."""
SMALL_TENSOR = 64
"""Initializers up to this many elements keep their values for shape inference."""
UNKNOWN_ELEMENTS = 4096
"""Assumed element count of a tensor whose shape shape-inference cannot find."""


class ValueSizes:
    """Element counts. Shapes the model does not declare come from ONNX shape inference, run
    once: ahead (``inferred``, from ``inferred_types``) or the first time a shape is missing."""

    def __init__(self, index: ModelIndex, inferred: dict[int, dict[str, TensorType]] | None = None) -> None:
        self.index = index
        self._inferred = inferred

    def elements(self, value: Value) -> int:
        if value.shape is None:
            self._read_inferred(value)
        if value.shape is None:
            return UNKNOWN_ELEMENTS
        return math.prod(d if isinstance(d, int) and d > 0 else (1 if d == 0 else SYMBOLIC_DIM)
                         for d in value.shape)

    def shape(self, value: Value) -> tuple | None:
        """The value's shape (ints, dimension names, or None for unknown extents), or None."""
        if value.shape is None:
            self._read_inferred(value)
        return value.shape

    def _read_inferred(self, value: Value) -> None:
        if self._inferred is None:
            self._inferred = inferred_types(self.index.model)
        graph_id, name = value.key
        found = self._inferred.get(graph_id, {}).get(name)
        if found is not None:
            elem_type, shape = found
            value.elem_type = value.elem_type or elem_type
            value.shape = shape if shape is not None else value.shape


def inferred_types(model: onnx.ModelProto) -> dict[int, dict[str, TensorType]]:
    """Tensor types by graph id (``ModelIndex``'s numbering) and name, from ONNX shape inference
    (empty when it fails: it is a best effort). They are read out of the inferred model at
    once, which is then dropped: kept, it would hold a second copy of every node."""
    light = without_weights(model).SerializeToString()  # the copy is gone before inference
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # a custom op or a bad model stops it
        return {}
    del light
    return {graph_id: {info.name: found for info in (*proto.value_info, *proto.output)
                       if (found := tensor_type(info.type)) is not None}
            for graph_id, proto in enumerate(iter_graphs(inferred.graph))}


def lacks_shapes(model: onnx.ModelProto) -> bool:
    """Whether the top-level graph declares fewer value infos than its nodes compute values:
    then costs will need shape inference."""
    graph = model.graph
    return len(graph.value_info) + len(graph.output) < sum(len(node.output) for node in graph.node)


def without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its large top-level initializers declared as inputs: inference needs
    their shapes, not their bytes, and serializing the bytes costs more than inferring."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    declared = {i.name for i in model.graph.input}
    for tensor in model.graph.initializer:
        if math.prod(tensor.dims) <= SMALL_TENSOR:  # shape operands: data propagation needs their values
            graph.initializer.append(tensor)
        elif tensor.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    return light


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A graph and its subgraphs, in the order ``ModelIndex`` numbers them."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from iter_graphs(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_graphs(sub)
