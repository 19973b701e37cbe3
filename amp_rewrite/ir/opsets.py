"""Default-domain opset upgrades, for passes that emit ops newer than a model's opset."""

from __future__ import annotations

import onnx
from onnx import helper, version_converter

from amp_rewrite.errors import UserError


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def ensure_opset(model: onnx.ModelProto, minimum: int) -> onnx.ModelProto:
    """``model`` itself when its default-domain opset is at least ``minimum``, else a copy
    upgraded with ONNX's version converter (a clear error when it cannot be)."""
    current = default_opset(model)
    if current is not None and current >= minimum:
        return model
    try:
        upgraded = version_converter.convert_version(model, minimum)
    except Exception as exc:  # the converter raises bare RuntimeErrors for ops it cannot adapt
        raise UserError(f"cannot upgrade the model from opset {current} to {minimum} "
                        f"(needed here): {str(exc).splitlines()[0][:200]}") from None
    needed_ir = helper.find_min_ir_version_for([helper.make_opsetid("", minimum)])
    upgraded.ir_version = max(upgraded.ir_version, needed_ir)
    return upgraded
