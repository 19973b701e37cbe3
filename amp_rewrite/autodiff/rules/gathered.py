"""The adjoint of a gather along one axis whose positions are known only at run time.

Resize and Pad (in edge, reflect and wrap mode) copy, along each axis, input positions to
output positions by a map the graph can compute from run-time extents, pads and scales:
output position ``o`` reads input position ``index[o]`` (times ``weight[o]``, for
interpolation). The gradient adds each output position's gradient onto the input position
it read: ``ScatterElements`` with ``reduction="add"`` (opset 16) over zeros of the input's
extent; a float16 or bfloat16 gradient is summed in float32 (a sum of many terms) and cast back.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.autodiff.context import SLICE_END
from amp_rewrite.ir.builder import GraphBuilder


def extent(b: GraphBuilder, x: str, axis: int) -> str:
    """The extent of ``x`` along ``axis``: an int64 scalar."""
    return b.op("Gather", b.op("Shape", x), b.const(np.array(axis, np.int64)), axis=0)


def positions(b: GraphBuilder, count: str) -> str:
    """0, 1, ..., count - 1 (int64) for an int64 scalar ``count``."""
    return b.op("Range", b.const(np.array(0, np.int64)), count, b.const(np.array(1, np.int64)))


def clipped(b: GraphBuilder, index: str, count: str) -> str:
    """``index`` held within [0, count - 1]."""
    last = b.op("Sub", count, b.const(np.array(1, np.int64)))
    return b.op("Max", b.op("Min", index, last), b.const(np.array(0, np.int64)))


def scattered(b: GraphBuilder, g: str, rank: int, axis: int, count: str, reads: list[tuple[str, str | None]]) -> str:
    """The gradient of an input of extent ``count`` along ``axis`` whose output (gradient
    ``g``) reads, for each ``(index, weight)`` of ``reads``, input position ``index[o]`` times
    ``weight[o]`` (a float, or None for 1) at output position ``o``."""
    along = [1] * rank
    along[axis] = -1
    per_axis = b.ints(along)
    elem = b.types[g]
    summed = TensorProto.FLOAT if elem in (TensorProto.FLOAT16, TensorProto.BFLOAT16) else elem
    wide = g if elem == summed else b.op("Cast", g, to=summed)
    dims = b.op("Shape", g)
    target = b.op("Concat", b.op("Slice", dims, b.ints([0]), b.ints([axis])), b.op("Reshape", count, b.ints([1])),
                  b.op("Slice", dims, b.ints([axis + 1]), b.ints([SLICE_END])), axis=0)
    zeros = b.op("ConstantOfShape", target, value=numpy_helper.from_array(
        np.zeros(1, helper.tensor_dtype_to_np_dtype(summed))))
    parts = []
    for index, weight in reads:
        spread = b.op("Expand", b.op("Reshape", index, per_axis), dims)
        if weight is not None and b.types[weight] != summed:
            weight = b.op("Cast", weight, to=summed)
        updates = wide if weight is None else b.op("Mul", wide, b.op("Reshape", weight, per_axis))
        parts.append(b.op("ScatterElements", zeros, spread, updates, axis=axis, reduction="add"))
    total = parts[0] if len(parts) == 1 else b.op("Sum", *parts)
    return total if elem == summed else b.op("Cast", total, to=elem)
