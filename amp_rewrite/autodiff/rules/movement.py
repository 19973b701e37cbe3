"""Gradient rules: data movement (linear maps that copy, select or rearrange elements).

Reshapes undo themselves with a ``Reshape`` to the input's shape; selections
(Slice, Gather, GatherElements) put the gradient back where the values came
from: into zeros with ``Pad`` or with a scatter that adds (an index read twice
gets both contributions); Concat/Split and Expand/Tile invert each other.
"""

from __future__ import annotations

import numpy as np

from amp_rewrite.autodiff.context import SLICE_END, Context
from amp_rewrite.autodiff.registry import register


@register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape_back(ctx: Context):
    return {0: ctx.b.op("Reshape", ctx.GO(0), ctx.shape_value(ctx.I(0)))}


@register("Transpose")
def _transpose(ctx: Context):
    perm = ctx.attr("perm")
    if perm is None:  # the default reverses the axes, and so does its inverse
        return {0: ctx.b.op("Transpose", ctx.GO(0))}
    return {0: ctx.b.op("Transpose", ctx.GO(0), perm=[int(i) for i in np.argsort(perm)])}


@register("Expand")
def _expand(ctx: Context):
    return {0: ctx.unbroadcast(ctx.go_or_zeros(0), ctx.I(0), ctx.O(0))}


@register("Tile")
def _tile(ctx: Context):
    """View GO as [r0, d0, r1, d1, ...] (repeats interleaved with the input's extents) and sum
    over the repeat axes."""
    b, x = ctx.b, ctx.I(0)
    rank = ctx.rank(x)
    if rank is None:
        raise ctx.error("the rank of its input is unknown")
    pairs = b.op("Concat", b.axes_op("Unsqueeze", ctx.I(1), [1]), b.axes_op("Unsqueeze", ctx.shape_value(x), [1]),
                 axis=1)
    interleaved = b.op("Reshape", ctx.GO(0), b.op("Reshape", pairs, b.ints([-1])))
    return {0: b.reduce_sum(interleaved, list(range(0, 2 * rank, 2)), keepdims=0)}


@register("Concat")
def _concat(ctx: Context):
    """Split GO along the axis into pieces as long as each input."""
    b, axis = ctx.b, ctx.attr("axis")
    lengths = [_extent(ctx, ctx.I(i), axis) for i in range(ctx.input_count)]
    static = [n for n in lengths if isinstance(n, int)]
    if len(static) == len(lengths):
        sizes = b.ints(static)
    else:
        sizes = b.op("Concat", *[b.ints([n]) if isinstance(n, int) else n for n in lengths], axis=0)
    pieces = b.ops("Split", ctx.GO(0), sizes, outputs=ctx.input_count, axis=axis)
    return {i: pieces[i] for i in range(ctx.input_count) if ctx.wants(i)}


def _extent(ctx: Context, x: str, axis: int) -> int | str:
    """``x``'s extent along ``axis``: an int when static, else a one-element int64 value."""
    shape = ctx.shape(x)
    if shape is not None and isinstance(shape[axis], int) and shape[axis] >= 0:
        return shape[axis]
    return ctx.b.op("Gather", ctx.b.op("Shape", x), ctx.b.ints([axis]), axis=0)


@register("Split")
def _split(ctx: Context):
    outputs = [ctx.go_or_zeros(i) for i in range(len(ctx.node.output))]
    return {0: ctx.b.op("Concat", *outputs, axis=ctx.attr("axis", 0))}


@register("Slice")
def _slice(ctx: Context):
    """Unit steps: pad GO with zeros back to the input's extents (bounds clamped as Slice
    clamps them, at run time when extents are symbolic). Other steps: scatter GO into zeros
    at the flat positions the same Slice selects from an index tensor."""
    b, x = ctx.b, ctx.I(0)
    steps = ctx.constant(4) if ctx.I(4) else None
    if ctx.I(4) and (steps is None or np.any(steps != 1)):
        return {0: _slice_by_scatter(ctx)}
    rank, given, starts = ctx.rank(x), ctx.constant(3) if ctx.I(3) else None, ctx.static_shape(ctx.I(1))
    if rank is None or (ctx.I(3) and given is None):
        return {0: _slice_by_scatter(ctx)}
    if given is not None:
        axes = [int(a) % rank for a in given]
    elif starts is not None:
        axes = list(range(starts[0]))
    else:
        return {0: _slice_by_scatter(ctx)}
    dims = b.op("Gather", ctx.shape_value(x), b.ints(axes), axis=0)
    begin, end = _clamp(ctx, ctx.I(1), dims), _clamp(ctx, ctx.I(2), dims)
    after = b.op("Sub", dims, end)
    zero = b.ints([0])
    parts = [[b.op("Slice", edge, b.ints([axes.index(a)]), b.ints([axes.index(a) + 1])) if a in axes else zero
              for a in range(rank)] for edge in (begin, after)]
    pads = b.op("Concat", *parts[0], *parts[1], axis=0)
    return {0: b.op("Pad", ctx.GO(0), pads, b.const(0.0, like=ctx.GO(0)))}


def _clamp(ctx: Context, bound: str, dims: str) -> str:
    """Slice's bound clamping for unit steps: negative counts from the end, then into [0, dim]."""
    b = ctx.b
    bound = b.op("Cast", bound, to=b.types[dims]) if b.types.get(bound) != b.types[dims] else bound
    zero = b.ints([0])
    wrapped = b.op("Where", b.op("Less", bound, zero), b.op("Add", bound, dims), bound)
    return b.op("Min", b.op("Max", wrapped, zero), dims)


def _slice_by_scatter(ctx: Context) -> str:
    b, x = ctx.b, ctx.I(0)
    shape = b.op("Shape", x)
    flat_positions = b.op("Range", b.const(np.int64(0)), b.op("Size", x), b.const(np.int64(1)))
    positions = b.op("Reshape", flat_positions, shape)
    picked = b.op("Slice", positions, *[ctx.I(i) or None for i in range(1, ctx.input_count)])
    flat = b.ints([-1])
    zeros = b.op("Reshape", b.zeros_like(x), flat)
    scattered = b.op("ScatterElements", zeros, b.op("Reshape", picked, flat), b.op("Reshape", ctx.GO(0), flat),
                     axis=0)
    return b.op("Reshape", scattered, shape)


@register("Gather")
def _gather(ctx: Context):
    """Scatter-add GO's slices into zeros at the gathered indices (an embedding's rows)."""
    b, x, indices = ctx.b, ctx.I(0), ctx.I(1)
    rank, index_rank = ctx.rank(x), ctx.rank(indices)
    if rank is None or index_rank is None:
        raise ctx.error("the ranks of its inputs are unknown", dynamic=True)
    axis = ctx.attr("axis", 0) % rank
    grad = ctx.go_or_zeros(0)
    if index_rank == 0:  # a scalar index dropped the axis: restore it
        grad, indices, index_rank = b.axes_op("Unsqueeze", grad, [axis]), b.axes_op("Unsqueeze", indices, [0]), 1
    front = [axis, *[a for a in range(rank) if a != axis]]
    table = b.op("Transpose", x, perm=front) if axis else x
    if axis:  # GO's index axes first, then the table's other axes in order
        grad = b.op("Transpose", grad, perm=[*range(axis, axis + index_rank), *range(axis),
                                             *range(axis + index_rank, rank - 1 + index_rank)])
    table_shape = b.op("Shape", table)
    rows = b.op("Slice", table_shape, b.ints([0]), b.ints([1]))
    indices = b.op("Reshape", indices, b.ints([-1, 1]))
    indices = b.op("Cast", indices, to=b.types[rows]) if b.types.get(indices) != b.types[rows] else indices
    indices = b.op("Where", b.op("Less", indices, b.ints([0])), b.op("Add", indices, rows), indices)
    updates = b.op("Reshape", grad, b.op("Concat", b.ints([-1]), b.op("Slice", table_shape, b.ints([1]),
                                                                      b.ints([rank])), axis=0))
    summed = b.op("ScatterND", b.zeros_like(table), indices, updates, reduction="add")
    return {0: b.op("Transpose", summed, perm=[int(i) for i in np.argsort(front)]) if axis else summed}


@register("GatherND", since=12)
def _gather_nd(ctx: Context):
    """Scatter-add GO into zeros at the gathered index tuples (negative ones counted from the end)."""
    if ctx.attr("batch_dims", 0):
        raise ctx.error("batch_dims other than 0 is not supported")
    b, x, indices = ctx.b, ctx.I(0), ctx.I(1)
    width = b.op("Slice", b.op("Shape", indices), b.ints([-1]), b.ints([SLICE_END]))
    bounds = b.op("Slice", b.op("Shape", x), b.ints([0]), width)
    indices = b.op("Where", b.op("Less", indices, b.ints([0])), b.op("Add", indices, bounds), indices)
    return {0: b.op("ScatterND", b.zeros_like(x), indices, ctx.GO(0), reduction="add")}


@register("GatherElements")
def _gather_elements(ctx: Context):
    b = ctx.b
    return {0: b.op("ScatterElements", b.zeros_like(ctx.I(0)), ctx.I(1), ctx.GO(0), axis=ctx.attr("axis", 0),
                    reduction="add")}
