"""UpgradeOpset: the model's opset admits the target precision, and is at least the one asked for."""

from __future__ import annotations

import onnx

from amp_rewrite.errors import UserError
from amp_rewrite.ir.opsets import default_opset, ensure_opset
from amp_rewrite.ir.precision import Precision
from amp_rewrite.rewrite.options import OutputOptions
from amp_rewrite.rewrite.passes.base import Pass, PassResult

BFLOAT16_OPSET = 13
"""The default-domain opset from which ONNX's ops accept bfloat16 (Add, MatMul, Conv...): below
it no node could run in bfloat16, and the conversion would change nothing."""


class UpgradeOpset(Pass[onnx.ModelProto]):
    """Invariant: the model's default-domain opset is at least ``output.opset`` (an error where
    onnx's version converter cannot upgrade it), and at least BFLOAT16_OPSET where bfloat16 is the
    target ``precision`` and the converter can upgrade it (where it cannot, the note says that no
    node can run in bfloat16 and why). The converter keeps the values' names and the model's function."""

    def __init__(self, output: OutputOptions, precision: Precision) -> None:
        self.opset = output.opset
        self.precision = precision

    def needed(self, model: onnx.ModelProto) -> bool:
        """Whether ``run`` would try to upgrade ``model``."""
        current = default_opset(model)
        return current is not None and (current < (self.opset or 0) or (
            self.precision is Precision.BFLOAT16 and current < BFLOAT16_OPSET))

    def run(self, model: onnx.ModelProto) -> PassResult:
        """Upgrade ``model`` in place, with a note saying from which opset to which, or why not."""
        current = default_opset(model)
        if current is None:
            return PassResult(False)
        if self.opset is not None and current < self.opset:
            model.CopyFrom(ensure_opset(model, self.opset))
            return PassResult(True, (f"upgraded the model from opset {current} to {self.opset} (asked for)",))
        if self.precision is Precision.BFLOAT16 and current < BFLOAT16_OPSET:
            try:
                model.CopyFrom(ensure_opset(model, BFLOAT16_OPSET))
            except UserError as exc:
                return PassResult(False, (
                    f"warning: ONNX ops accept bfloat16 from opset {BFLOAT16_OPSET}, and this model is at "
                    f"opset {current}: nothing can run in bfloat16 ({exc}); upgrade it with --opset "
                    f"{BFLOAT16_OPSET} once its ops allow",))
            return PassResult(True, (f"upgraded the model from opset {current} to {BFLOAT16_OPSET}: ONNX ops "
                                     f"accept bfloat16 from opset {BFLOAT16_OPSET} (--opset N asks for another)",))
        return PassResult(False)
