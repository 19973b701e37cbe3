"""Emulate a mixed-precision model's numerics on a float32 runtime.

ONNX Runtime's CPU provider runs most float16 nodes by casting them to float32
and back only at its own convenience, so running a mixed model there says
little about a GPU. ``emulated`` derives a float32 model in which every value
the mixed model holds in low precision is rounded to that precision where it is
produced (a ``Cast`` to the low type and back), so storage rounding, overflow to
inf and underflow to zero all happen where the GPU would see them, while each
node computes in float32 as Tensor Core kernels accumulate.
"""

from __future__ import annotations

import onnx
import onnx.defs
from onnx import AttributeProto, TensorProto, numpy_helper

from amp_rewrite.ir.builder import LOW_TYPES, GraphBuilder, Names
from amp_rewrite.ir.graph import INITIALIZER, NODE, ModelIndex, PendingInserts, Value
from amp_rewrite.ir.types import typed_index
from amp_rewrite.policy.oplists import RETYPED_BY_ATTRIBUTE, op_key

LOW_PRECISION_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider",
                                     "ROCMExecutionProvider", "DmlExecutionProvider"})
"""Providers that run float16 nodes in float16; elsewhere runs emulate by default."""
_SUFFIX = "__amp_emul"


def emulated(mixed: onnx.ModelProto) -> onnx.ModelProto:
    """A float32 model computing what ``mixed`` computes, rounded as ``mixed`` stores.

    Graph inputs and outputs keep their declared types, so the same feeds run both.
    """
    model = onnx.ModelProto()
    model.CopyFrom(mixed)
    index = typed_index(model)
    inserts = PendingInserts()
    builder = GraphBuilder(Names.of_model(model), index.opsets.get("", onnx.defs.onnx_opset_version()))
    for value in list(index.all_values()):
        if value.elem_type in LOW_TYPES:
            _rewrite(index, value, inserts, builder)
    for graph in index.graphs:
        graph.proto.ClearField("value_info")
        for info in (*graph.proto.input, *graph.proto.output) if graph.id else ():
            _retype(info)
    inserts.apply(index)
    return model


def _rewrite(index: ModelIndex, value: Value, inserts: PendingInserts, builder: GraphBuilder) -> None:
    graph_id, name = value.key
    low = value.elem_type
    if value.source == NODE and value.producer is not None and not _is_constant(index, value):
        node = index.nodes[value.producer[0]]
        _compute_in_float(node.proto)
        raw = builder.names.fresh(name + _SUFFIX + "_raw")
        node.proto.output[value.producer[1]] = raw
        rounding = builder.child()
        if graph_id == 0 and value.output_of:  # a graph output keeps its low type
            rounding.op("Cast", raw, outputs=[name], to=low)
            inserts.after(index, value, rounding.nodes)
            if value.uses:
                _redirect(index, value, inserts, builder)
            return
        stored = rounding.op("Cast", raw, outputs=[builder.names.fresh(name + _SUFFIX + "_stored")], to=low)
        rounding.op("Cast", stored, outputs=[name], to=TensorProto.FLOAT)
        inserts.after(index, value, rounding.nodes)
        return
    if value.source == NODE or value.source == INITIALIZER or graph_id == 0:
        _redirect(index, value, inserts, builder)
    # a low-typed subgraph input receives values that are already rounded float32: retyped with the graph


def _redirect(index: ModelIndex, value: Value, inserts: PendingInserts, builder: GraphBuilder) -> None:
    """Readers of a low value read its float32 copy instead (the copy is exact)."""
    widening = builder.child()
    widened = widening.op("Cast", value.name, outputs=[builder.names.fresh(value.name + _SUFFIX + "_f32")],
                          to=TensorProto.FLOAT)
    inserts.after(index, value, widening.nodes)
    for node_id, slot in value.uses:
        index.nodes[node_id].proto.input[slot] = widened
    for graph_id in value.output_of:
        for info in index.graphs[graph_id].proto.output if graph_id else ():
            if info.name == value.name:
                info.name = widened


def _is_constant(index: ModelIndex, value: Value) -> bool:
    node = index.producer_node(value)
    return node is not None and node.op_type == "Constant" and node.domain == ""


def _compute_in_float(node: onnx.NodeProto) -> None:
    """An op whose output type an attribute fixes now produces float32."""
    attribute = RETYPED_BY_ATTRIBUTE.get(op_key(node.domain, node.op_type))
    for attr in node.attribute:
        if attr.name != attribute and attr.name != "dtype":
            continue
        if attr.type == AttributeProto.INT and attr.i in LOW_TYPES:
            attr.i = TensorProto.FLOAT
        elif attr.type == AttributeProto.TENSOR and attr.t.data_type in LOW_TYPES:
            attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype("float32"), attr.t.name))


def _retype(info: onnx.ValueInfoProto) -> None:
    if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type in LOW_TYPES:
        info.type.tensor_type.elem_type = TensorProto.FLOAT

