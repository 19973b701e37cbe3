"""InlineFunctions: no node calls a function that the model defines."""

from __future__ import annotations

import onnx

from amp_rewrite.ir.functions import inlined
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class InlineFunctions(Pass[onnx.ModelProto]):
    """Invariant: the model defines no local functions; each node that called one is replaced by
    the function's body, its values renamed apart (what ONNX Runtime does when it loads the
    model), so every node of the body gets a precision of its own. Left whole, a call is an op
    that no policy lists: float32, with Casts around it, however much MatMul work it holds
    (exporters write a transformer block, or each layer, as one function)."""

    def run(self, model: onnx.ModelProto) -> PassResult:
        """Inline ``model``'s functions in place, with a note saying how many (none where it defines none)."""
        if not model.functions:
            return PassResult(False)
        count = len(model.functions)
        try:
            model.CopyFrom(inlined(model))
        except ValueError as exc:  # the calls stay whole, as unknown ops
            return PassResult(False, (f"the model's {count} local function(s) could not be inlined ({exc}): "
                                      "their calls stay float32",))
        return PassResult(True, (f"inlined the model's {count} local function(s), as ONNX Runtime does when it "
                                 "loads the model",))
