"""Element types of every value, from declarations, attributes and the ONNX op schemas."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import onnx
import onnx.defs
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


def infer_types(index: ModelIndex) -> int:
    """Give a value lacking an element type the one its producer's schema, attributes or
    subgraph declare (two sweeps, so subgraph outputs are known); how many got one. Shapes
    are not inferred here; ``sizes`` does that lazily when a cost needs one."""
    values = index.values
    typed = 0
    for _ in range(2):
        for node in index.nodes:
            for key in node.outputs:
                if key is not None and values[key].elem_type is None:
                    typed += _infer(index, node)
                    break
    return typed


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
    fixed = _attribute_type(proto, domain, proto.op_type)
    if fixed is not None:
        return [fixed] * len(proto.output)
    return _schema_types(domain, proto.op_type, opset, input_types, len(proto.output))


def _schema_types(domain: str, op_type: str, opset: int, input_types: Sequence[int | None],
                  count: int) -> list[int | None]:
    plan = _output_plan(domain, op_type, opset, len(input_types), count)
    if plan is None:
        return [None] * count
    found: list[int | None] = []
    for inputs, fallback in plan:
        for i in inputs:
            elem_type = input_types[i]
            if elem_type:
                found.append(elem_type)
                break
        else:
            found.append(fallback)
    return found


_OutputPlan = tuple[tuple[tuple[int, ...], int | None], ...]
"""Per output: the inputs bound to its type parameter (the first typed one gives its type), and
the type it has when none is typed (a fixed formal, or a parameter admitting one type)."""


@functools.cache
def _output_plan(domain: str, op_type: str, opset: int, n_inputs: int, n_outputs: int) -> _OutputPlan | None:
    sig = signature(domain, op_type, opset, n_inputs, n_outputs)
    if sig is None:
        return None
    plan = tuple(
        (tuple(i for i, f in enumerate(sig.inputs) if f == formal) if sig.is_param(formal) else (),
         sig.fixed_type(formal))
        for formal in sig.outputs)
    return plan + (((), None),) * (n_outputs - len(plan))


def _infer(index: ModelIndex, node: Node) -> int:
    """Type the node's untyped outputs where it implies their types; how many it typed."""
    values = index.values
    typed = 0
    fixed = _attribute_type(node.proto, node.domain, node.op_type)
    subgraph = _subgraph_types(index, node) if fixed is None else None
    if subgraph is None:
        if fixed is not None:
            implied: list[int | None] = [fixed] * len(node.outputs)
        else:
            inputs = [values[key].elem_type if key else None for key in node.inputs]
            implied = _schema_types(node.domain, node.op_type, index.opsets.get(node.domain, 1), inputs,
                                    len(node.outputs))
    for i, key in enumerate(node.outputs):
        value = values[key] if key else None
        if value is not None and value.elem_type is None:
            value.elem_type = subgraph.get(i) if subgraph is not None else implied[i]
            typed += value.elem_type is not None
    return typed


def _attribute_type(proto: onnx.NodeProto, domain: str, op_type: str) -> int | None:
    """The output type an attribute fixes: ``to``/``dtype``, or a Constant's value."""
    if domain != "":
        return None
    if _typed_by_attribute(op_type):
        for attr in proto.attribute:
            if attr.name in ("to", "dtype") and attr.type == AttributeProto.INT:
                return attr.i
            if op_type in ("Constant", "ConstantOfShape") and attr.type == AttributeProto.TENSOR:
                return attr.t.data_type
            if op_type == "Constant" and attr.name in _CONSTANT_ATTRIBUTE_TYPES:
                return _CONSTANT_ATTRIBUTE_TYPES[attr.name]
    return _DEFAULT_OUTPUT_TYPES.get(op_type)


@functools.cache
def _typed_by_attribute(op_type: str) -> bool:
    """Whether a default-domain op may have an attribute that fixes its output type: a
    Constant, or an op whose schema (in some version) declares ``to`` or ``dtype``. An op
    ONNX has no schema for is read as if it might. The others' attributes are never read
    (reading attributes is a large share of inference's time)."""
    if op_type in ("Constant", "ConstantOfShape") or not onnx.defs.has(op_type):
        return True
    version = onnx.defs.onnx_opset_version()
    while version > 0:
        try:
            schema = onnx.defs.get_schema(op_type, version)
        except onnx.defs.SchemaError:
            return False  # no version of the op at or below this one
        if "to" in schema.attributes or "dtype" in schema.attributes:
            return True
        version = schema.since_version - 1
    return False


def _subgraph_types(index: ModelIndex, node: Node) -> dict[int, int] | None:
    offset = SUBGRAPH_OUTPUT_OFFSET.get(node.op_type)
    if offset is None or node.domain != "":
        return None
    graph_ids = index.subgraphs.get(node.id)
    if not graph_ids:
        return None
    outputs = index.graphs[graph_ids[0]].outputs[offset:]
    return {i: t for i, key in enumerate(outputs) if (t := index.values[key].elem_type)}
