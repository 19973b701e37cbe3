"""Default-domain opset upgrades, for passes that emit ops newer than a model's opset."""

from __future__ import annotations

import math

import onnx
from onnx import helper, version_converter

from amp_rewrite.errors import UserError
from amp_rewrite.ir.sizes import SMALL_TENSOR

VALUE_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
"""The fields of a TensorProto that hold its values in the model."""


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def ensure_opset(model: onnx.ModelProto, minimum: int) -> onnx.ModelProto:
    """``model`` itself when its default-domain opset is at least ``minimum``, else a copy
    upgraded with ONNX's version converter (a clear error when it cannot be). The converter
    adapts ops, not weights: it gets the top-level initializers over ``SMALL_TENSOR`` elements
    without their values, which go back in by name (the converter copies the model whole, more
    than once: large weights would make that the upgrade's whole cost; the result has the same
    bytes)."""
    current = default_opset(model)
    if current is not None and current >= minimum:
        return model
    light, weights = _without_weight_values(model)
    try:
        upgraded = version_converter.convert_version(light, minimum)
    except Exception as exc:  # the converter raises bare RuntimeErrors for ops it cannot adapt
        raise UserError(f"cannot upgrade the model from opset {current} to {minimum} "
                        f"(needed here): {str(exc).splitlines()[0][:200]}") from None
    del light
    channel_slopes = _channel_slopes(upgraded) if (current or 1) < NUMPY_PRELU <= minimum else {}
    for tensor in upgraded.graph.initializer:
        if (values := weights.get(tensor.name)) is not None:
            tensor.CopyFrom(values)
    _broadcast_on_channels(upgraded.graph, channel_slopes)
    needed_ir = helper.find_min_ir_version_for([helper.make_opsetid("", minimum)])
    upgraded.ir_version = max(upgraded.ir_version, needed_ir)
    return upgraded


def _without_weight_values(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """A copy of ``model`` whose large top-level initializers (held in it) keep their name, type
    and shape but not their values, and those initializers of ``model`` by name."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    weights = {}
    for original, tensor in zip(model.graph.initializer, light.graph.initializer):
        if math.prod(tensor.dims) > SMALL_TENSOR and tensor.data_location != onnx.TensorProto.EXTERNAL:
            weights[tensor.name] = original
            for field in VALUE_FIELDS:
                tensor.ClearField(field)
    return light, weights


NUMPY_PRELU = 7
"""The opset from which PRelu broadcasts its slope as numpy does (against the last axes); before,
a slope of C elements applies along axis 1, the channels. The version converter leaves it as it is."""


def _channel_slopes(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of the input of each top-level PRelu whose slope is an initializer of C > 1
    elements in one dimension, by slope, where that rank is over 2 (at rank 2 the channels are
    the last axis) and the slope is read by PRelus alone."""
    graph = model.graph
    slopes = {t.name for t in graph.initializer if len(t.dims) == 1 and t.dims[0] > 1}
    prelus = [n for n in graph.node if n.op_type == "PRelu" and n.domain in ("", "ai.onnx") and n.input[1] in slopes]
    if not prelus:
        return {}
    shared = {name for n in graph.node if n.op_type != "PRelu" for name in n.input}
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph  # the model without its weights' values
    except Exception:  # inference is a best effort: without ranks, the slopes stay as they are
        return {}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*inferred.input, *inferred.value_info)
             if v.type.tensor_type.HasField("shape")}
    found: dict[str, int] = {}
    for node in prelus:
        rank = ranks.get(node.input[0], 0)
        if rank > 2 and node.input[1] not in shared and found.setdefault(node.input[1], rank) == rank:
            continue
        found[node.input[1]] = 0  # not on channels, or read at two ranks: left as it is
    return {name: rank for name, rank in found.items() if rank}


def _broadcast_on_channels(graph: onnx.GraphProto, slopes: dict[str, int]) -> None:
    """Give each of ``slopes`` (and its input, where initializers are listed as inputs too) the
    shape [C, 1, ..., 1] that broadcasts it along axis 1 of an input of its rank: same values."""
    for tensor in graph.initializer:
        if tensor.name in slopes:
            tensor.dims.extend([1] * (slopes[tensor.name] - 2))
    for info in graph.input:
        if info.name in slopes and info.type.tensor_type.HasField("shape"):
            for _ in range(slopes[info.name] - 2):
                info.type.tensor_type.shape.dim.add(dim_value=1)
