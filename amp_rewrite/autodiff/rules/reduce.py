"""Gradient rules: reductions over axes given as an attribute or as an input.

The output gradient is put back to the input's rank (``Unsqueeze`` at the reduced
axes when ``keepdims`` is 0) and broadcast to its shape (``Expand``); each op then
multiplies by its own local derivative.
"""

from __future__ import annotations

import math

from amp_rewrite.autodiff.context import Context
from amp_rewrite.autodiff.registry import register

_AXES_INPUT_SINCE = {"ReduceSum": 13}
"""Opset from which the axes are an input (18 for the other reductions)."""


def _axes(ctx: Context, op: str) -> list[int] | str | None:
    """The reduced axes: a list (constant), a value name (computed), or None for every axis."""
    if ctx.opset >= _AXES_INPUT_SINCE.get(op, 18):
        if not ctx.I(1):
            return None
        found = ctx.constant(1)
        return [int(a) for a in found.ravel()] if found is not None else ctx.I(1)
    axes = ctx.attr("axes")
    return None if axes is None else list(axes)


def _is_noop(ctx: Context, axes) -> bool:
    return axes == [] or (axes is None and ctx.attr("noop_with_empty_axes", 0) == 1 and ctx.I(1) != "")


def expand_back(ctx: Context, value: str, op: str) -> str:
    """``value`` (shaped like the reduction's output) broadcast to the input's shape."""
    b, x = ctx.b, ctx.I(0)
    axes = _axes(ctx, op)
    if _is_noop(ctx, axes):
        return value
    if not ctx.attr("keepdims", 1) and axes is not None:
        value = b.axes_op("Unsqueeze", value, axes)
    return b.op("Expand", value, ctx.shape_value(x))


def _reduced_count(ctx: Context, op: str) -> str:
    """How many input elements each output element summarises, like the input."""
    b, x = ctx.b, ctx.I(0)
    shape, axes = ctx.static_shape(x), _axes(ctx, op)
    if shape is not None and not isinstance(axes, str):
        picked = range(len(shape)) if axes is None else [a % len(shape) for a in axes]
        return b.const(float(math.prod(shape[a] for a in picked)), like=x)
    ratio = b.op("Div", b.op("Size", x), b.op("Size", ctx.O(0)))
    return b.op("Cast", ratio, to=b.types[x])


@register("ReduceSum")
def _reduce_sum(ctx: Context):
    return {0: expand_back(ctx, ctx.go_or_zeros(0), "ReduceSum")}


@register("ReduceMean")
def _reduce_mean(ctx: Context):
    b = ctx.b
    # Divided before it is broadcast: one division per output element, not per input element.
    return {0: expand_back(ctx, b.op("Div", ctx.GO(0), _reduced_count(ctx, "ReduceMean")), "ReduceMean")}


@register("ReduceMax", "ReduceMin")
def _reduce_select(ctx: Context):
    """The gradient goes to the elements equal to the selected value."""
    b, op = ctx.b, ctx.node.op_type
    picked = b.op("Equal", ctx.I(0), expand_back(ctx, ctx.O(0), op))
    grad = expand_back(ctx, ctx.go_or_zeros(0), op)
    return {0: b.op("Where", picked, grad, b.const(0.0, like=grad))}


@register("ReduceSumSquare")
def _reduce_sum_square(ctx: Context):
    b, x = ctx.b, ctx.I(0)
    grad = expand_back(ctx, ctx.go_or_zeros(0), "ReduceSumSquare")
    return {0: b.op("Mul", grad, b.op("Mul", x, b.const(2.0, like=x)))}


@register("ReduceL1")
def _reduce_l1(ctx: Context):
    return {0: ctx.b.op("Mul", expand_back(ctx, ctx.go_or_zeros(0), "ReduceL1"), ctx.b.op("Sign", ctx.I(0)))}


@register("ReduceL2")
def _reduce_l2(ctx: Context):
    b, x = ctx.b, ctx.I(0)
    norm = expand_back(ctx, ctx.O(0), "ReduceL2")
    return {0: b.op("Mul", expand_back(ctx, ctx.go_or_zeros(0), "ReduceL2"), b.op("Div", x, norm))}


@register("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx: Context):
    b, x = ctx.b, ctx.I(0)
    softmax = b.op("Exp", b.op("Sub", x, expand_back(ctx, ctx.O(0), "ReduceLogSumExp")))
    return {0: b.op("Mul", expand_back(ctx, ctx.go_or_zeros(0), "ReduceLogSumExp"), softmax)}


