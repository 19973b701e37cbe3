"""Element counts of values, for the cost of a cast; shapes the model lacks are inferred."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any

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
    """Element counts. Shapes the model does not declare come from ONNX shape inference: run
    ahead (``inferred``, from ``inferred_types``) or the first time a shape is missing."""

    def __init__(self, index: ModelIndex, inferred: InferredTypes | None = None) -> None:
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
        found = self._inferred.get(graph_id, name)
        if found is not None:
            elem_type, shape = found
            value.elem_type = value.elem_type or elem_type
            value.shape = shape if shape is not None else value.shape


class InferredTypes:
    """Tensor types that ONNX shape inference found, by graph id (``ModelIndex``'s numbering)
    and name. Of the inferred model, only its graphs' value infos are parsed, each as its name
    and its type's bytes (``_infos_type``: parsing the whole model costs more than the
    inference, and a parsed TypeProto, or a tensor type, per value holds a message per value
    that the costs mostly never read); a type is read when asked for (the costs ask for a
    fraction of them)."""

    def __init__(self, inferred: bytes) -> None:
        self._types = [{info.name: info.type for infos in (graph.value_info, graph.output) for info in infos}
                       for graph in iter_graphs(_infos_type().FromString(inferred).graph)]

    def get(self, graph_id: int, name: str) -> TensorType | None:
        found = self._types[graph_id].get(name) if graph_id < len(self._types) else None
        return None if found is None else tensor_type(onnx.TypeProto.FromString(found))

    def serialized(self, graph_id: int) -> dict[str, bytes]:
        """Each inferred value of the graph ``graph_id`` and its serialized TypeProto."""
        return self._types[graph_id] if graph_id < len(self._types) else {}


@functools.cache
def _infos_type() -> type[Any]:
    """A message type that reads a serialized ModelProto's graphs as their value infos,
    outputs (name and type's bytes) and subgraphs alone, by onnx's field numbers: what else
    the model holds is skipped as unknown bytes, with no message made for it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field_type = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="amp_rewrite/inferred_infos.proto", package="amp_rewrite")
    # message -> (onnx's message, its fields: a message type of this file, or how the wire is read)
    shapes: dict[str, tuple[Any, dict[str, Any]]] = {
        "Model": (onnx.ModelProto, {"graph": "Graph"}),
        "Graph": (onnx.GraphProto, {"node": "Node", "output": "ValueInfo", "value_info": "ValueInfo"}),
        "Node": (onnx.NodeProto, {"attribute": "Attribute"}),
        "Attribute": (onnx.AttributeProto, {"g": "Graph", "graphs": "Graph", "type": field_type.TYPE_INT32}),
        "ValueInfo": (onnx.ValueInfoProto, {"name": field_type.TYPE_STRING, "type": field_type.TYPE_BYTES})}
    for name, (proto, fields) in shapes.items():
        message = file.message_type.add(name=name)
        for field_name, kind in fields.items():
            declared = proto.DESCRIPTOR.fields_by_name[field_name]
            label = field_type.LABEL_REPEATED if declared.is_repeated else field_type.LABEL_OPTIONAL
            if isinstance(kind, str):
                message.field.add(name=field_name, number=declared.number, type=field_type.TYPE_MESSAGE, label=label,
                                  type_name=f".amp_rewrite.{kind}")
            else:  # a scalar, read as it is on the wire (an enum as its integer)
                message.field.add(name=field_name, number=declared.number, type=kind, label=label)
    pool = descriptor_pool.Default()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("amp_rewrite.Model"))


def inferred_types(model: onnx.ModelProto) -> InferredTypes:
    """The tensor types ONNX shape inference (data propagation on) finds in ``model`` without
    its weights (none when it fails: it is a best effort). Inference is called as
    ``onnx.shape_inference.infer_shapes`` calls it, on the serialized model, and its result is
    parsed lightly (``InferredTypes``) rather than as a ModelProto."""
    from onnx.onnx_cpp2py_export import shape_inference

    try:
        inferred = shape_inference.infer_shapes(without_weights(model).SerializeToString(), False, False, True)
    except Exception:  # a custom op or a bad model stops it
        inferred = b""
    return InferredTypes(inferred)


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
        dims = tensor.dims
        if math.prod(dims) <= SMALL_TENSOR:  # shape operands: data propagation needs their values
            graph.initializer.append(tensor)
        elif tensor.name not in declared:  # declared in place: helper.make_tensor_value_info builds and copies one
            tensor_type = graph.input.add(name=tensor.name).type.tensor_type
            tensor_type.elem_type = tensor.data_type
            shape = tensor_type.shape.dim
            for size in dims:
                shape.add(dim_value=size)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    return light


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A graph and its subgraphs, in the order ``ModelIndex`` numbers them."""
    yield graph
    for node in graph.node:
        attributes = node.attribute  # read once: each protobuf field access costs, for every node
        if attributes:
            for attr in attributes:
                kind = attr.type
                if kind == _GRAPH:
                    yield from iter_graphs(attr.g)
                elif kind == _GRAPHS:
                    for sub in attr.graphs:
                        yield from iter_graphs(sub)


def has_subgraphs(graph: onnx.GraphProto) -> bool:
    """Whether a node of ``graph`` holds a graph."""
    return next(itertools.islice(iter_graphs(graph), 1, None), None) is not None


_GRAPH, _GRAPHS = AttributeProto.GRAPH, AttributeProto.GRAPHS
