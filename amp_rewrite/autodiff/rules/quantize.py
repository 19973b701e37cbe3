"""Gradient rules: QuantizeLinear and DequantizeLinear, as quantization-aware training differentiates them.

DequantizeLinear ``y = (x - zp) * s`` is linear in its scale: GI(s) is ``GO * (x - zp)`` summed
to the scale's shape (one value, or one per channel along ``axis``), so every scale of a QDQ
model is a parameter. Its integer ``x`` gets ``GO * s`` only where a QuantizeLinear made it.

QuantizeLinear ``q = saturate(round(x / s) + zp)`` is ``straight_through`` (PyTorch's
FakeQuantize): the rounding counts as the identity, so GI(x) is ``GO / s`` where
``round(x / s) + zp`` lies in the output type's range and 0 where it saturates. GI(s) is
``-GI(x) * x / s`` summed to the scale's shape; where one scale feeds a Q -> DQ pair, it and
the DequantizeLinear's share sum to Learned Step Size Quantization's gradient (Esser et al.,
2019): ``round(x / s) - x / s`` inside the range, ``qmin - zp`` or ``qmax - zp`` beyond it.

Integer inputs and zero points get nothing. Blocked scales (``block_size``) and float8 outputs
are refused by name.
"""

from __future__ import annotations

from onnx import TensorProto

from amp_rewrite.autodiff.context import Context
from amp_rewrite.autodiff.registry import register

RANGES: dict[int, tuple[int, int]] = {
    TensorProto.INT8: (-128, 127), TensorProto.UINT8: (0, 255),
    TensorProto.INT16: (-32768, 32767), TensorProto.UINT16: (0, 65535),
    TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
}
"""[qmin, qmax] of each integer type QuantizeLinear rounds into: where it saturates."""


@register("DequantizeLinear", since=10)
def _dequantize(ctx: Context):
    b, x, scale, g = ctx.b, ctx.I(0), ctx.I(1), ctx.go_or_zeros(0)
    along = _broadcast(ctx)
    grads = {}
    if ctx.wants(0):  # the straight-through gradient of a QuantizeLinear's output
        grads[0] = b.op("Mul", g, _as(ctx, along(scale), g))
    if ctx.wants(1):
        steps = b.op("Cast", x, to=b.types[scale])
        if ctx.I(2):
            steps = b.op("Sub", steps, along(b.op("Cast", ctx.I(2), to=b.types[scale])))
        grads[1] = _sum_to_scale(ctx, b.op("Mul", _as(ctx, g, scale), steps))
    return grads


@register("QuantizeLinear", since=10, straight_through=True)
def _quantize(ctx: Context):
    b, x, scale = ctx.b, ctx.I(0), ctx.I(1)
    ends = RANGES.get(b.types.get(ctx.O(0), TensorProto.UNDEFINED))
    if ends is None:
        raise ctx.error("only quantization to integers is differentiated (the straight-through rule "
                        "needs a range to saturate in)")
    along = _broadcast(ctx)
    s = along(_as(ctx, scale, x))
    steps = b.op("Div", x, s)  # x / s: where it rounds to, and LSQ's scale term
    bounds = [b.const(float(q), like=x) for q in ends]
    if ctx.I(2):
        zero_point = along(b.op("Cast", ctx.I(2), to=b.types[x]))
        bounds = [b.op("Sub", q, zero_point) for q in bounds]
    rounded = b.op("Round", steps)
    inside = b.op("And", b.op("GreaterOrEqual", rounded, bounds[0]), b.op("LessOrEqual", rounded, bounds[1]))
    grad_x = b.op("Where", inside, b.op("Div", _as(ctx, ctx.go_or_zeros(0), x), s), b.const(0.0, like=x))
    grads = {0: grad_x} if ctx.wants(0) else {}
    if ctx.wants(1):
        grads[1] = _as(ctx, b.op("Neg", _sum_to_scale(ctx, b.op("Mul", grad_x, steps))), scale)
    return grads


def _broadcast(ctx: Context):
    """A function that lays a scale-shaped value along ``x`` (per-axis: [C] -> [C, 1, ...]), after
    refusing what the rules do not cover; per-tensor values broadcast as they are."""
    if ctx.attr("block_size", 0):
        raise ctx.error("blocked quantization (block_size) is not differentiated")
    axis, rank = _axis(ctx), ctx.rank(ctx.I(0))
    if axis is None or rank is None or axis == rank - 1:
        return lambda value: value
    trailing = ctx.b.ints([-1] + [1] * (rank - 1 - axis))
    return lambda value: ctx.b.op("Reshape", value, trailing)


def _axis(ctx: Context) -> int | None:
    """The axis a per-axis scale runs along, or None for a per-tensor (one-element) scale."""
    shape = ctx.static_shape(ctx.I(1))
    if shape is None:
        raise ctx.error("the shape of its scale is unknown", dynamic=True)
    if len(shape) == 0 or shape == (1,):
        return None
    rank = ctx.rank(ctx.I(0))
    if rank is None:
        raise ctx.error("the rank of its input is unknown", dynamic=True)
    return ctx.attr("axis", 1) % rank


def _sum_to_scale(ctx: Context, value: str) -> str:
    """``value`` (shaped like ``x``) summed to the scale's shape: over every axis but ``axis``."""
    b, scale = ctx.b, ctx.I(1)
    axis = _axis(ctx)
    if axis is None:
        total = b.op("ReduceSum", value, keepdims=0)
        return b.op("Reshape", total, b.ints([1])) if ctx.rank(scale) else total
    return b.reduce_sum(value, [a for a in range(ctx.rank(ctx.I(0)) or 0) if a != axis], keepdims=0)


def _as(ctx: Context, value: str, like: str) -> str:
    """``value`` in ``like``'s element type (a Cast only where they differ)."""
    elem_type = ctx.b.types[like]
    return value if ctx.b.types.get(value) == elem_type else ctx.b.op("Cast", value, to=elem_type)
