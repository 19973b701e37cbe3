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
    without their values, which go back in by name (through it, a 575 MB VGG-19 took 10.3 s;
    so, 1.0 s, the same bytes)."""
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
    for tensor in upgraded.graph.initializer:
        if (values := weights.get(tensor.name)) is not None:
            tensor.CopyFrom(values)
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
