"""UpgradeOpset: the model's opset admits the target precision, and is at least the one asked for."""

from __future__ import annotations

import onnx

from amp_rewrite.errors import UserError
from amp_rewrite.ir.opsets import default_opset, ensure_opset
from amp_rewrite.ir.precision import Precision
from amp_rewrite.rewrite.options import ConvertOptions

BFLOAT16_OPSET = 13
"""The default-domain opset from which ONNX's ops accept bfloat16 (Add, MatMul, Conv...): below
it no node could run in bfloat16, and the conversion would change nothing."""


class UpgradeOpset:
    """Invariant: the model's default-domain opset is at least ``options.opset`` (an error where
    onnx's version converter cannot upgrade it), and at least BFLOAT16_OPSET where bfloat16 is the
    target and the converter can upgrade it (where it cannot, the note says that no node can run
    in bfloat16 and why). The converter keeps the values' names and the model's function."""

    @staticmethod
    def needed(model: onnx.ModelProto, options: ConvertOptions) -> bool:
        """Whether ``run`` would try to upgrade ``model``."""
        current = default_opset(model)
        return current is not None and (current < (options.opset or 0) or (
            options.precision is Precision.BFLOAT16 and current < BFLOAT16_OPSET))

    def run(self, model: onnx.ModelProto, options: ConvertOptions) -> str | None:
        """Upgrade ``model`` in place; a note saying from which opset to which, or why not."""
        current = default_opset(model)
        if current is None:
            return None
        if options.opset is not None and current < options.opset:
            model.CopyFrom(ensure_opset(model, options.opset))
            return f"upgraded the model from opset {current} to {options.opset} (asked for)"
        if options.precision is Precision.BFLOAT16 and current < BFLOAT16_OPSET:
            try:
                model.CopyFrom(ensure_opset(model, BFLOAT16_OPSET))
            except UserError as exc:
                return (f"warning: ONNX ops accept bfloat16 from opset {BFLOAT16_OPSET}, and this model is at "
                        f"opset {current}: nothing can run in bfloat16 ({exc}); upgrade it with --opset "
                        f"{BFLOAT16_OPSET} once its ops allow")
            return (f"upgraded the model from opset {current} to {BFLOAT16_OPSET}: ONNX ops accept bfloat16 "
                    f"from opset {BFLOAT16_OPSET} (--opset N asks for another)")
        return None
