"""Element types of every value, from declarations, attributes and the ONNX op schemas."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import AttributeProto, TensorProto

from amp_rewrite.ir.graph import ModelIndex, Node
from amp_rewrite.ir.schemas import signature

_CONSTANT_ATTRIBUTE_TYPES = {
    "value_float": TensorProto.FLOAT, "value_floats": TensorProto.FLOAT,
    "value_int": TensorProto.INT64, "value_ints": TensorProto.INT64,
    "value_string": TensorProto.STRING, "value_strings": TensorProto.STRING,
}
# Output types of ops whose type attribute is absent and whose output is not tied to an input.
_DEFAULT_OUTPUT_TYPES = {"ConstantOfShape": TensorProto.FLOAT, "RandomNormal": TensorProto.FLOAT,
                         "RandomUniform": TensorProto.FLOAT, "Multinomial": TensorProto.INT32}
# For control-flow ops: node output i is subgraph output i + offset.
SUBGRAPH_OUTPUT_OFFSET = {"If": 0, "Loop": 1, "Scan": 0}


def infer_types(index: ModelIndex) -> None:
    """Give a value lacking an element type the one its producer's schema, attributes or
    subgraph declare (two sweeps, so subgraph outputs are known). Shapes are not inferred
    here; ``sizes`` does that lazily when a cost needs one."""
    for _ in range(2):
        for node in index.nodes:
            if any(k is not None and index.values[k].elem_type is None for k in node.outputs):
                _infer(index, node)


def value_types(index: ModelIndex) -> dict[str, int]:
    """Element type by value name, for the values whose type is known (names are unique model-wide)."""
    return {v.name: v.elem_type for v in index.all_values() if v.elem_type}


def typed_index(model: onnx.ModelProto) -> ModelIndex:
    """The model's def-use index, every value with the element type its declarations and schemas imply."""
    index = ModelIndex(model)
    infer_types(index)
    return index


def output_types(proto: onnx.NodeProto, opset: int, input_types: Sequence[int | None]) -> list[int | None]:
    """Element types of a node's outputs that its attributes or schema imply, given its inputs' types."""
    domain = "" if proto.domain == "ai.onnx" else proto.domain
    count = len(proto.output)
    fixed = _attribute_type(proto, domain)
    if fixed is not None:
        return [fixed] * count
    sig = signature(domain, proto.op_type, opset, len(input_types), count)
    if sig is None:
        return [None] * count
    bound: dict[str, int] = {}
    for formal, elem_type in zip(sig.inputs, input_types):
        if elem_type and sig.is_param(formal):
            bound.setdefault(formal, elem_type)
    found = [bound.get(formal) or sig.fixed_type(formal) for formal in sig.outputs]
    return found + [None] * (count - len(found))


def _infer(index: ModelIndex, node: Node) -> None:
    subgraph = _subgraph_types(index, node) if _attribute_type(node.proto, node.domain) is None else None
    inputs = [index.values[key].elem_type if key else None for key in node.inputs]
    implied = output_types(node.proto, index.opset(node), inputs) if subgraph is None else None
    for i, key in enumerate(node.outputs):
        value = index.values[key] if key else None
        if value is not None and value.elem_type is None:
            value.elem_type = subgraph.get(i) if subgraph is not None else implied[i]


def _attribute_type(proto: onnx.NodeProto, domain: str) -> int | None:
    """The output type an attribute fixes: ``to``/``dtype``, or a Constant's value."""
    if domain != "":
        return None
    for attr in proto.attribute:
        if attr.name in ("to", "dtype") and attr.type == AttributeProto.INT:
            return attr.i
        if proto.op_type in ("Constant", "ConstantOfShape") and attr.type == AttributeProto.TENSOR:
            return attr.t.data_type
        if proto.op_type == "Constant" and attr.name in _CONSTANT_ATTRIBUTE_TYPES:
            return _CONSTANT_ATTRIBUTE_TYPES[attr.name]
    return _DEFAULT_OUTPUT_TYPES.get(proto.op_type)


def _subgraph_types(index: ModelIndex, node: Node) -> dict[int, int] | None:
    offset = SUBGRAPH_OUTPUT_OFFSET.get(node.op_type)
    if offset is None or node.domain != "":
        return None
    graph_ids = index.subgraphs.get(node.id)
    if not graph_ids:
        return None
    outputs = index.graphs[graph_ids[0]].outputs[offset:]
    return {i: t for i, key in enumerate(outputs) if (t := index.values[key].elem_type)}
