"""DeclareInferredShapes: the types shape inference found are declared in the model."""

from __future__ import annotations

import onnx

from amp_rewrite.ir.io import length_delimited
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.policy.oplists import op_key
from amp_rewrite.rewrite.passes.base import Pass, PassResult
from amp_rewrite.rewrite.passes.insert_casts import Rewrite


class DeclareInferredShapes(Pass[Rewrite]):
    """Invariant: where the analysis inferred the shapes the model lacks (``Analysis.inferred``)
    and the rewrite changed some value's type, in each graph that declares no value info, every
    value that inference typed and the graph does not declare as an input, initializer or output
    has a value_info entry with that type, as the rewrite left it (``RewriteStats.retyped``). A
    graph that declares some is left as its exporter wrote it (and a converted one as it is:
    converting again changes nothing), and so is a model that stays float32. Runs after the
    rewrite, whose new values (casts' outputs) stay undeclared.

    ONNX Runtime infers shapes on load too, but without ONNX's data propagation: behind a
    Reshape to a computed shape it finds no rank, and its fusions that check shapes give up
    (SkipLayerNormalization: a BERT encoder's residual Adds and LayerNorms, which the ORT
    float16 script's outputs, declaring them, fuse). In a model with an op whose output extent
    depends on the data (``EMPTY_MAKERS``: the NonZero of a score threshold, the NonMaxSuppression
    of a detector), the symbols ONNX's inference invented (``unk__N``) are left out (such dims
    declared unknown): ONNX Runtime 1.31's ReshapeFusion matches a Reshape's target dims to its
    input's by those symbols and writes [0, -1] for it, which fails on the empty tensors such a
    model makes (torchvision's RetinaNet with no detection). Drops ``Analysis.inferred``: its memory
    goes with this pass. The entries are built as their serialized form and parsed by protobuf
    in one call per graph, which costs less than making a message per entry.
    """

    def run(self, rewrite: Rewrite) -> PassResult:
        analysis, retyped = rewrite.analysis, rewrite.stats.retyped
        inferred, analysis.inferred = analysis.inferred, None
        if inferred is None or not retyped:
            return PassResult(False)
        declared = 0
        type_fields: dict[tuple[bytes, int | None], bytes] = {}
        named_only = any(node.op_type in EMPTY_MAKERS and not op_key(node.domain, node.op_type)[0]
                         for node in analysis.index.nodes)
        # the graphs as the rewrite left them: rebuilding a node list (``PendingInserts``) copies
        # its nodes, and the subgraphs they hold, away from the index's protos
        top = analysis.index.model.graph
        for graph_id, proto in enumerate(iter_graphs(top) if len(analysis.index.graphs) > 1 else [top]):
            found = inferred.serialized(graph_id)
            if not found or len(proto.value_info):
                continue
            known = {info.name for infos in (proto.input, proto.output) for info in infos}
            known.update(tensor.name for tensor in proto.initializer)
            entries = bytearray()  # the graph's value_info field
            for name, serialized in found.items():
                if name in known:
                    continue
                elem_type = retyped.get((graph_id, name))
                type_field = type_fields.get((serialized, elem_type))  # most values share a few types
                if type_field is None:
                    if named_only:
                        retyped_type = _without_invented_dims(serialized, elem_type)
                    else:
                        retyped_type = serialized if elem_type is None else _with_elem_type(serialized, elem_type)
                    type_field = type_fields[serialized, elem_type] = length_delimited(_TYPE, retyped_type)
                entries += length_delimited(_VALUE_INFO, length_delimited(_NAME, name.encode()) + type_field)
                declared += 1
            proto.MergeFromString(bytes(entries))
        return PassResult(declared > 0)


EMPTY_MAKERS = frozenset(("NonZero", "NonMaxSuppression", "Compress", "Unique"))
"""Default-domain ops whose output extent depends on the input's values (none selected: an empty tensor)."""

INVENTED_DIM = "unk__"
"""The prefix of the dim symbols ONNX's shape inference makes up."""


def _without_invented_dims(serialized: bytes, elem_type: int | None) -> bytes:
    """The serialized TypeProto ``serialized`` with the dims named ``INVENTED_DIM``... unknown
    (and its element type ``elem_type``, where given)."""
    type_proto = onnx.TypeProto.FromString(serialized)
    if type_proto.HasField("tensor_type"):
        if elem_type is not None:
            type_proto.tensor_type.elem_type = elem_type
        for dim in type_proto.tensor_type.shape.dim:
            if dim.dim_param.startswith(INVENTED_DIM):
                dim.ClearField("dim_param")
    return type_proto.SerializeToString()


def _with_elem_type(serialized: bytes, elem_type: int) -> bytes:
    """The serialized TypeProto ``serialized``, its tensor type's element type set to ``elem_type``.
    As ONNX's shape inference writes a tensor type (fields by number), its first bytes are the
    ``tensor_type`` key, the length, and the ``elem_type`` key and value: a one-byte value (every
    type but the newest) is replaced in place; anything else is parsed and written again."""
    at = 1
    while at < len(serialized) and serialized[at] & 0x80:  # the tensor type's length
        at += 1
    at += 1
    if (serialized[:1] == _TENSOR_TYPE_KEY and serialized[at:at + 1] == _ELEM_TYPE_KEY and at + 1 < len(serialized)
            and serialized[at + 1] < 0x80 and elem_type < 0x80):
        return serialized[:at + 1] + bytes((elem_type,)) + serialized[at + 2:]
    type_proto = onnx.TypeProto.FromString(serialized)
    if type_proto.HasField("tensor_type"):
        type_proto.tensor_type.elem_type = elem_type
    return type_proto.SerializeToString()


_VALUE_INFO = onnx.GraphProto.DESCRIPTOR.fields_by_name["value_info"].number
_NAME, _TYPE = (onnx.ValueInfoProto.DESCRIPTOR.fields_by_name[f].number for f in ("name", "type"))
_TENSOR_TYPE_KEY = bytes([onnx.TypeProto.DESCRIPTOR.fields_by_name["tensor_type"].number << 3 | 2])
_ELEM_TYPE_KEY = bytes([onnx.TypeProto.Tensor.DESCRIPTOR.fields_by_name["elem_type"].number << 3])
