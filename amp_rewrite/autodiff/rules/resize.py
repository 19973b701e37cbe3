"""Gradient rules: Resize.

Resize is linear in its input along each resized axis, so its gradient multiplies
GO by the transposed interpolation matrix of each axis, computed at build time
with ONNX's Resize semantics (those of the reference implementation,
``onnx/reference/ops/op_resize.py``): nearest (every ``nearest_mode``), linear and
cubic, every coordinate transformation, ``scales`` or ``sizes``. Where the extents,
scales or sizes are known only at run time (a decoder resizing to a skip
connection's ``Shape``), nearest and linear resizes get the same gradient from the
graph: each output position's source coordinate computed from the run-time extents,
its gradient added onto the input positions it reads (``gathered``).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from amp_rewrite.autodiff.context import Context, DynamicShapes
from amp_rewrite.autodiff.registry import register
from amp_rewrite.autodiff.rules.gathered import clipped, extent, positions, scattered
from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder


@register("Resize", since=11, constant=(1, 2))
def _resize(ctx: Context):
    """Y = X x_k A_k over the resized axes k (A_k: out_k x in_k interpolation weights), so
    dX = GO x_k A_k^T: one MatMul per resized axis with a constant built here from the static
    extents, the constant scales or sizes, and the node's attributes."""
    b, x, g = ctx.b, ctx.I(0), ctx.go_or_zeros(0)
    shape = ctx.shape(x)
    if shape is None:
        raise ctx.error("the rank of its input is not known")
    rank = len(shape)
    try:
        matrices = _resize_matrices(ctx, shape)
    except DynamicShapes as exc:
        return {0: _resize_runtime(ctx, rank, exc)}
    grad = g
    for axis, weights in matrices:
        grad = _contract(ctx, grad, b.const(weights, like=g), axis, rank)
    return {0: grad}


_RUNTIME_MODES = ("nearest", "linear")
_NEAREST = {"round_prefer_floor": lambda b, x: b.op("Ceil", b.op("Sub", x, b.const(0.5, like=x))),
            "round_prefer_ceil": lambda b, x: b.op("Floor", b.op("Add", x, b.const(0.5, like=x))),
            "floor": lambda b, x: b.op("Floor", x), "ceil": lambda b, x: b.op("Ceil", x)}
"""Each ``nearest_mode``: the input position a source coordinate reads (before clipping)."""


def _resize_runtime(ctx: Context, rank: int, why: DynamicShapes) -> str:
    """The input gradient of a nearest or linear Resize whose extents, scales or sizes are
    known only at run time: per resized axis, the source coordinate of every output position
    (``_SOURCES``, ONNX Runtime's formulas), its neighbours held within the input, their
    weights; ``why`` is raised where the mode, transformation or attributes need more."""
    mode, transform = ctx.attr("mode", "nearest"), ctx.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in _RUNTIME_MODES or transform not in _SOURCES or ctx.attr("antialias", 0) or \
            ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch" or \
            (mode == "nearest" and ctx.attr("nearest_mode", "round_prefer_floor") not in _NEAREST):
        raise why
    b, x = ctx.b, ctx.I(0)
    by_sizes = bool(ctx.I(3))
    constant_scales = None if by_sizes else ctx.constant(2)
    grad = ctx.go_or_zeros(0)
    for i, axis in enumerate(a % rank for a in ctx.attr("axes") or range(rank)):
        if constant_scales is not None and math.isclose(float(constant_scales.ravel()[i]), 1.0):
            continue  # left alone
        count, out = extent(b, x, axis), extent(b, grad, axis)
        inputs, outputs = (b.op("Cast", v, to=TensorProto.FLOAT) for v in (count, out))
        scale = b.op("Div", outputs, inputs) if by_sizes else \
            b.op("Gather", b.op("Cast", ctx.I(2), to=TensorProto.FLOAT), b.const(np.array(i, np.int64)), axis=0)
        source = _SOURCES[transform](b, b.op("Cast", positions(b, out), to=TensorProto.FLOAT), scale, inputs,
                                     outputs)
        if mode == "nearest":
            picked = _NEAREST[ctx.attr("nearest_mode", "round_prefer_floor")](b, source)
            reads: list[tuple[str, str | None]] = [(clipped(b, b.op("Cast", picked, to=TensorProto.INT64), count),
                                                    None)]
        else:
            left = b.op("Floor", source)
            ratio = b.op("Sub", source, left)
            first = b.op("Cast", left, to=TensorProto.INT64)
            reads = [(clipped(b, first, count), b.op("Sub", b.const(1.0, like=ratio), ratio)),
                     (clipped(b, b.op("Add", first, b.const(np.array(1, np.int64))), count), ratio)]
        grad = scattered(b, grad, rank, axis, count, reads)
    return grad


def _half_pixel(b: GraphBuilder, y: str, scale: str, inputs: str, outputs: str) -> str:
    return b.op("Sub", b.op("Div", b.op("Add", y, b.const(0.5, like=y)), scale), b.const(0.5, like=y))


def _when_several(b: GraphBuilder, outputs: str, value: str) -> str:
    """``value`` where the axis has more than one output position, else 0."""
    return b.op("Where", b.op("Greater", outputs, b.const(1.0, like=outputs)), value, b.const(0.0, like=value))


_SOURCES = {
    "half_pixel": _half_pixel,
    "pytorch_half_pixel": lambda b, y, scale, inputs, outputs: _when_several(
        b, outputs, _half_pixel(b, y, scale, inputs, outputs)),
    "asymmetric": lambda b, y, scale, inputs, outputs: b.op("Div", y, scale),
    "align_corners": lambda b, y, scale, inputs, outputs: _when_several(b, outputs, b.op(
        "Div", b.op("Mul", y, b.op("Sub", inputs, b.const(1.0, like=y))), b.op("Sub", outputs, b.const(1.0, like=y)))),
    "half_pixel_symmetric": lambda b, y, scale, inputs, outputs: b.op("Add", b.op(
        "Mul", b.op("Div", inputs, b.const(2.0, like=y)),
        b.op("Sub", b.const(1.0, like=y), b.op("Div", outputs, b.op("Mul", scale, inputs)))),
        _half_pixel(b, y, scale, inputs, outputs)),
}
"""Each coordinate transformation: the float32 source coordinate of output positions ``y``
(the reference implementation's ``x_original``) from the scale and the float32 extents."""


def _contract(ctx: Context, grad: str, weights: str, axis: int, rank: int) -> str:
    """``grad`` (out_k along ``axis``) times ``weights`` (out_k x in_k) over that axis."""
    b = ctx.b
    if axis == rank - 1:
        return b.op("MatMul", grad, weights)
    if axis == rank - 2:
        return b.op("MatMul", b.op("Transpose", weights, perm=[1, 0]), grad)
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    return b.op("Transpose", b.op("MatMul", b.op("Transpose", grad, perm=perm), weights), perm=perm)


def _resize_matrices(ctx: Context, shape: tuple) -> list[tuple[int, np.ndarray]]:
    """(axis, out x in weights) for every axis the Resize changes, following the reference
    implementation: the output size and the scale of each axis from ``scales`` or ``sizes``
    (with ``axes`` and ``keep_aspect_ratio_policy``), axes left alone skipped."""
    rank = len(shape)
    scales = ctx.constant(2) if ctx.I(2) else None
    sizes = ctx.constant(3) if ctx.I(3) else None
    scales = scales if scales is not None and scales.size else None
    sizes = sizes if sizes is not None and sizes.size else None
    if scales is None and sizes is None:
        raise ctx.error("its scales or sizes are not constants", dynamic=True)
    axes = [a % rank for a in ctx.attr("axes") or range(rank)]
    roi_value = ctx.constant(1) if ctx.I(1) else None
    roi = None
    if roi_value is not None and roi_value.size:
        roi = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            roi[a], roi[rank + a] = float(roi_value.ravel()[i]), float(roi_value.ravel()[len(axes) + i])
    mode = ctx.attr("mode", "nearest")
    transform = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if transform == "tf_crop_and_resize" and roi is None:
        raise ctx.error("coordinate_transformation_mode tf_crop_and_resize needs a constant roi")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"unknown mode {mode!r}")
    if mode == "nearest" and ctx.attr("antialias", 0):
        raise ctx.error("antialias is not defined for mode nearest")
    coefficients = _coefficients(mode, ctx.attr("nearest_mode", "round_prefer_floor"), ctx.attr("cubic_coeff_a", -0.75),
                                 bool(ctx.attr("antialias", 0)))
    extents = {a: shape[a] if isinstance(shape[a], int) and shape[a] >= 0 else None for a in axes}
    if scales is not None:
        factors = {a: float(scales.ravel()[i]) for i, a in enumerate(axes)}
        outs = {a: None if (size := extents[a]) is None else int(factors[a] * size) for a in axes}
    else:
        assert sizes is not None  # scales or sizes is a constant (checked above)
        wanted = {a: int(sizes.ravel()[i]) for i, a in enumerate(axes)}
        missing = [a for a in axes if extents[a] is None]
        if missing:
            raise ctx.error(f"it resizes to sizes but the input's extent along axis {missing[0]} is not static",
                            dynamic=True)
        static = {a: size for a, size in extents.items() if size is not None}  # every axis, here
        factors = {a: wanted[a] / static[a] for a in axes}
        outs = dict(wanted)
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise ctx.error(f"unknown keep_aspect_ratio_policy {policy!r}")
            scale = (min if policy == "not_larger" else max)(factors.values())
            factors = dict.fromkeys(axes, scale)
            outs = {a: int(scale * static[a] + 0.5) for a in axes}
    found = []
    for a in axes:
        size, out = extents[a], outs[a]
        untouched_roi = roi is None or (math.isclose(roi[a], 0.0) and math.isclose(roi[rank + a], 1.0))
        if math.isclose(factors[a], 1.0) and untouched_roi and (size is None or out == size):
            continue  # left alone, as the reference implementation leaves it
        if size is None or out is None:  # the output extent is None only where the input's is
            raise ctx.error(f"it resizes axis {a}, whose extent is not static", dynamic=True)
        weights = resize_weights(size, out, factors[a], transform, coefficients,
                                 None if roi is None else (roi[a], roi[rank + a]),
                                 bool(ctx.attr("exclude_outside", 0)))
        found.append((a, weights))
    return found


def _coefficients(mode: str, nearest_mode: str, cubic_a: float, antialias: bool):
    """``f(ratio, scale)``: the interpolation weights of the neighbours of a source coordinate
    whose distance past its left neighbour is ``ratio`` (in (0, 1])."""
    if mode == "nearest":
        def nearest(ratio: float, scale: float) -> np.ndarray:
            if ratio == 1.0:
                return np.array([0.0, 1.0])
            pick = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                    "floor": False, "ceil": True}[nearest_mode]
            return np.array([0.0, 1.0]) if pick else np.array([1.0, 0.0])
        return nearest
    if mode == "linear" and not antialias:
        return lambda ratio, scale: np.array([1 - ratio, ratio])
    if mode == "linear":
        def linear(ratio: float, scale: float) -> np.ndarray:
            scale = min(scale, 1.0)
            start = int(np.floor(-1 / scale) + 1)
            args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
            weights = np.clip(1 - np.abs(args), 0, 1)
            return weights / weights.sum()
        return linear

    def kernel(t: float) -> float:
        t = abs(t)
        if t <= 1:
            return (cubic_a + 2) * t**3 - (cubic_a + 3) * t**2 + 1
        if t < 2:
            return cubic_a * t**3 - 5 * cubic_a * t**2 + 8 * cubic_a * t - 4 * cubic_a
        return 0.0

    if not antialias:
        return lambda ratio, scale: np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])

    def cubic(ratio: float, scale: float) -> np.ndarray:
        scale = min(scale, 1.0)
        start = int(np.floor(-2 / scale) + 1)
        weights = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
        return weights / weights.sum()
    return cubic


def resize_weights(extent: int, out: int, scale: float, transform: str, coefficients,
                   roi: tuple[float, float] | None = None, exclude_outside: bool = False) -> np.ndarray:
    """The out x extent matrix A with resize(x) = A @ x along one axis (ONNX Resize semantics,
    as ``_interpolate_1d_along_axis`` of the reference implementation computes them; positions
    ``tf_crop_and_resize`` extrapolates get a zero row, their value being a constant)."""
    y = np.arange(out, dtype=np.float64)
    width = scale * extent
    outside = None
    if transform == "align_corners":
        x = np.zeros(out) if width == 1 else y * (extent - 1) / (width - 1)
    elif transform == "asymmetric":
        x = y / scale
    elif transform == "tf_crop_and_resize":
        assert roi is not None, "tf_crop_and_resize needs the roi"
        start, stop = roi
        x = (np.full(out, (stop - start) * (extent - 1) / 2) if width == 1
             else y * (stop - start) * (extent - 1) / (width - 1)) + start * (extent - 1)
        outside = (x < 0) | (x > extent - 1)
    elif transform == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif transform == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif transform == "half_pixel_symmetric":
        x = extent / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    elif transform == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    else:
        raise UserError(f"unknown coordinate_transformation_mode {transform!r}")
    left = np.floor(x)
    ratios = np.where(x == left, 1.0, x - left)
    coeffs = np.stack([np.asarray(coefficients(float(r), scale), dtype=np.float64) for r in ratios])
    n = coeffs.shape[1]
    pad = math.ceil(n / 2)
    shifted = x + pad
    base = np.floor(shifted)
    frac = shifted - base
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    neighbours = (base + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((neighbours < 0) | (neighbours >= extent), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    weights = np.zeros((out, extent))
    np.add.at(weights, (np.repeat(np.arange(out), n), np.clip(neighbours, 0, extent - 1).ravel()), coeffs.ravel())
    if outside is not None:
        weights[outside] = 0.0
    return weights
