"""A model's own functions inlined: the graph ONNX Runtime runs."""

from __future__ import annotations

import onnx
import onnx.inliner


def inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which every call of a function it defines (``model.functions``) is
    the function's body, its values renamed apart, nested calls too (onnx's inliner, converting
    a function's opset version to the model's where they differ). Raises ValueError where the
    inliner refuses the model."""
    try:
        return onnx.inliner.inline_local_functions(model, convert_version=True)
    except Exception as exc:  # the inliner's C++ errors come in several types
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
