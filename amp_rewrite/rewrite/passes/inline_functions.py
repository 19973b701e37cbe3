"""InlineFunctions: no node calls a function that the model defines."""

from __future__ import annotations

import onnx

from amp_rewrite.ir.functions import inlined


class InlineFunctions:
    """Invariant: the model defines no local functions; each node that called one is replaced by
    the function's body, its values renamed apart (what ONNX Runtime does when it loads the
    model), so every node of the body gets a precision of its own. Left whole, a call is an op
    that no policy lists: float32, with Casts around it, however much MatMul work it holds
    (exporters write a transformer block, or each layer, as one function)."""

    def run(self, model: onnx.ModelProto) -> str | None:
        """Inline ``model``'s functions in place; a note saying how many, or None where it defines none."""
        if not model.functions:
            return None
        count = len(model.functions)
        try:
            model.CopyFrom(inlined(model))
        except ValueError as exc:  # the calls stay whole, as unknown ops
            return f"the model's {count} local function(s) could not be inlined ({exc}): their calls stay float32"
        return f"inlined the model's {count} local function(s), as ONNX Runtime does when it loads the model"
