"""InferTypes: give every value the element type its producer's schema implies."""

from __future__ import annotations

from onnx import AttributeProto, TensorProto

from ..analysis import Analysis
from ..graph import Node
from ..schemas import signature

_CONSTANT_ATTRIBUTE_TYPES = {
    "value_float": TensorProto.FLOAT, "value_floats": TensorProto.FLOAT,
    "value_int": TensorProto.INT64, "value_ints": TensorProto.INT64,
    "value_string": TensorProto.STRING, "value_strings": TensorProto.STRING,
}
# Output types of ops whose type attribute is absent and whose output is not tied to an input.
_DEFAULT_OUTPUT_TYPES = {"ConstantOfShape": TensorProto.FLOAT, "RandomNormal": TensorProto.FLOAT,
                         "RandomUniform": TensorProto.FLOAT, "Multinomial": TensorProto.INT32}
# For control-flow ops: node output i is subgraph output i + offset.
_SUBGRAPH_OUTPUT_OFFSET = {"If": 0, "Loop": 1, "Scan": 0}


class InferTypes:
    """Invariant: a value lacking an element type gets one when its producer's schema,
    attributes or subgraph declare it (two sweeps, so subgraph outputs are known).
    Shapes are not inferred here; ``sizes`` does that lazily when a cost needs one.
    """

    def run(self, analysis: Analysis) -> None:
        index = analysis.index
        for _ in range(2):
            for node in index.nodes:
                if any(k is not None and index.values[k].elem_type is None for k in node.outputs):
                    self._infer(analysis, node)

    def _infer(self, analysis: Analysis, node: Node) -> None:
        index = analysis.index
        fixed = _attribute_type(node) or _subgraph_types(analysis, node)
        sig = signature(node.domain, node.op_type, index.opset(node), len(node.inputs), len(node.outputs))
        bound: dict[str, int] = {}
        if sig is not None:
            for formal, key in zip(sig.inputs, node.inputs):
                elem_type = index.values[key].elem_type if key else None
                if elem_type and sig.is_param(formal):
                    bound.setdefault(formal, elem_type)
        for i, key in enumerate(node.outputs):
            value = index.values[key] if key else None
            if value is None or value.elem_type is not None:
                continue
            if isinstance(fixed, dict):
                value.elem_type = fixed.get(i)
            elif fixed is not None:
                value.elem_type = fixed
            elif sig is not None and i < len(sig.outputs):
                formal = sig.outputs[i]
                value.elem_type = bound.get(formal) or sig.fixed_type(formal)


def _attribute_type(node: Node) -> int | None:
    """The output type an attribute fixes: ``to``/``dtype``, or a Constant's value."""
    if node.domain != "":
        return None
    for attr in node.proto.attribute:
        if attr.name in ("to", "dtype") and attr.type == AttributeProto.INT:
            return attr.i
        if node.op_type in ("Constant", "ConstantOfShape") and attr.type == AttributeProto.TENSOR:
            return attr.t.data_type
        if node.op_type == "Constant" and attr.name in _CONSTANT_ATTRIBUTE_TYPES:
            return _CONSTANT_ATTRIBUTE_TYPES[attr.name]
    return _DEFAULT_OUTPUT_TYPES.get(node.op_type)


def _subgraph_types(analysis: Analysis, node: Node) -> dict[int, int] | None:
    offset = _SUBGRAPH_OUTPUT_OFFSET.get(node.op_type)
    if offset is None or node.domain != "":
        return None
    graph_ids = analysis.index.subgraphs.get(node.id)
    if not graph_ids:
        return None
    outputs = analysis.index.graphs[graph_ids[0]].outputs[offset:]
    return {i: t for i, key in enumerate(outputs) if (t := analysis.index.values[key].elem_type)}
