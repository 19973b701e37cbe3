"""Gradient rules: Pad in every mode.

Constant padding's input gradient is GO with the padding sliced off (and zeros
where negative pads cropped); its constant value's gradient is the sum of GO over
the padding. Reflect, edge and wrap add each padded element's gradient back onto
the element it copies: with constant pads and extents, slices of GO; with pads or
extents known only at run time, a scatter-add of GO onto the positions each output
position copies (``gathered``).
"""

from __future__ import annotations

import numpy as np

from amp_rewrite.autodiff.context import SLICE_END, Context, DynamicShapes
from amp_rewrite.autodiff.registry import register
from amp_rewrite.autodiff.rules.gathered import clipped, extent, positions, scattered


@register("Pad", since=11)
def _pad(ctx: Context):
    """constant: dX is GO cut back to X's extent (a Slice for positive pads, zeros for the
    positions negative pads cropped), d(constant_value) the sum of GO over the padding;
    reflect, edge, wrap: the padded borders' gradients are added back onto the input positions
    they copy, axis by axis."""
    mode = ctx.attr("mode", "constant")
    x, g = ctx.I(0), ctx.go_or_zeros(0)
    rank = ctx.rank(x)
    pad_values = ctx.constant(1)
    axes = _pad_axes(ctx, rank)
    if pad_values is None:
        if mode != "constant":
            return {0: _uncopy_runtime(ctx, g, mode, rank, axes)} if ctx.wants(0) else {}
        kept = _unpad_runtime(ctx, g, rank)
    else:
        pads = [int(p) for p in pad_values.ravel()]
        n = len(pads) // 2
        if axes is None:
            axes = list(range(n))
        begin, end = pads[:n], pads[n:]
        if mode != "constant" and ctx.wants(0):
            try:
                return {0: _unpad_copies(ctx, g, mode, axes, begin, end)}
            except DynamicShapes:  # a padded extent known only at run time
                return {0: _uncopy_runtime(ctx, g, mode, rank, axes)}
        if mode != "constant":
            return {}
        kept = _unpad_constant(ctx, g, rank, axes, begin, end)
    grads = {}
    if ctx.wants(0):
        grads[0] = kept[1]
    if ctx.wants(2) and mode == "constant":
        b = ctx.b
        border = b.op("Sub", b.op("ReduceSum", g, keepdims=0), b.op("ReduceSum", kept[0], keepdims=0))
        grads[2] = b.op("Reshape", border, ctx.shape_value(ctx.I(2)))
    return grads


def _pad_axes(ctx: Context, rank: int | None) -> list[int] | None:
    """The padded axes (opset 18's ``axes`` input), non-negative, or None for every axis."""
    if not ctx.I(3):
        return None
    found = ctx.constant(3)
    if found is None:
        raise ctx.error("its axes input is not a constant", dynamic=True)
    axes = [int(a) for a in found.ravel()]
    if any(a < 0 for a in axes):
        if rank is None:
            raise ctx.error("it pads negative axes of an input whose rank is not known", dynamic=True)
        axes = [a % rank for a in axes]
    return axes


def _unpad_constant(ctx: Context, g: str, rank: int | None, axes: list[int], begin: list[int],
                    end: list[int]) -> tuple[str, str]:
    """(GO sliced to the part copied from X, that part put back at X's extent)."""
    b = ctx.b
    kept = g
    if any(p > 0 for p in begin + end):
        kept = b.op("Slice", g, b.ints([max(p, 0) for p in begin]), b.ints([-p if p > 0 else SLICE_END for p in end]),
                    b.ints(axes))
    if not any(p < 0 for p in begin + end):
        return kept, kept
    if rank is None:
        raise ctx.error("it crops (negative pads) an input whose rank is not known", dynamic=True)
    full = [0] * (2 * rank)
    for a, p, q in zip(axes, begin, end):
        full[a], full[rank + a] = max(-p, 0), max(-q, 0)
    return kept, b.op("Pad", kept, b.ints(full))


def _unpad_runtime(ctx: Context, g: str, rank: int | None) -> tuple[str, str]:
    """:func:`_unpad_constant` for pads known only at run time (constant mode)."""
    b = ctx.b
    pads = ctx.I(1)
    if ctx.I(3):
        axes = ctx.I(3)
        count = b.op("Shape", axes)
        dims = b.op("Gather", b.op("Shape", g), axes, axis=0)
    else:
        if rank is None:
            raise ctx.error("its pads are not constant and its input's rank is not known", dynamic=True)
        axes, count, dims = b.ints(list(range(rank))), b.ints([rank]), b.op("Shape", g)
    begin = b.op("Slice", pads, b.ints([0]), count)
    end = b.op("Slice", pads, count, b.ints([SLICE_END]))
    zero = b.ints([0])
    kept = b.op("Slice", g, b.op("Max", begin, zero), b.op("Sub", dims, b.op("Max", end, zero)), axes)
    crop = b.op("Concat", b.op("Max", b.op("Neg", begin), zero), b.op("Max", b.op("Neg", end), zero), axis=0)
    if ctx.I(3):
        return kept, b.op("Pad", kept, crop, "", axes)
    return kept, b.op("Pad", kept, crop)


def _unpad_copies(ctx: Context, g: str, mode: str, axes: list[int], begin: list[int], end: list[int]) -> str:
    """The adjoint of reflect, edge and wrap padding: per axis, the centre plus each border's
    gradient put back on the input positions it copies."""
    if mode not in ("reflect", "edge", "wrap"):
        raise ctx.error(f"unknown Pad mode {mode!r}")
    if any(p < 0 for p in begin + end):
        raise ctx.error(f"negative pads (crops) in mode {mode!r} are not supported")
    shape = ctx.shape(ctx.I(0))
    padded: list[tuple[int, int, int, int]] = []
    for a, p, q in zip(axes, begin, end):  # all checked before any node is built
        if not (p or q):
            continue
        size = shape[a] if shape is not None else None
        if not isinstance(size, int):
            raise ctx.error(f"mode {mode!r} needs the static extent of padded axis {a}", dynamic=True)
        if mode == "reflect" and max(p, q) > size - 1:
            raise ctx.error(f"reflect pads of {max(p, q)} exceed the extent {size} of axis {a} less one")
        if mode == "wrap" and max(p, q) > size:
            raise ctx.error(f"wrap pads of {max(p, q)} exceed the extent {size} of axis {a}")
        padded.append((a, p, q, size))
    grad = g
    for a, p, q, size in padded:
        grad = _unpad_axis(ctx, grad, mode, a, p, q, size)
    return grad


def _unpad_axis(ctx: Context, g: str, mode: str, axis: int, before: int, after: int, extent: int) -> str:
    b = ctx.b
    rank = ctx.rank(ctx.I(0))
    assert rank is not None  # the caller read the input's static extents

    def cut(start: int, stop: int, step: int = 1) -> str:
        return b.op("Slice", g, b.ints([start]), b.ints([stop]), b.ints([axis]), b.ints([step]))

    def place(part: str, lead: int, trail: int) -> str:
        if lead == 0 and trail == 0:
            return part
        full = [0] * (2 * rank)
        full[axis], full[rank + axis] = lead, trail
        return b.op("Pad", part, b.ints(full))

    parts = [cut(before, before + extent)]
    if mode == "edge":
        if before:
            parts.append(place(b.reduce_sum(cut(0, before), [axis], keepdims=1), 0, extent - 1))
        if after:
            parts.append(place(b.reduce_sum(cut(before + extent, SLICE_END), [axis], keepdims=1), extent - 1, 0))
    elif mode == "reflect":  # border j (from the input) copies x[before - j]; trailing j copies x[extent - 2 - j]
        if before:
            parts.append(place(cut(before - 1, -SLICE_END, -1), 1, extent - 1 - before))
        if after:
            length = before + extent + after
            parts.append(place(cut(length - 1, before + extent - 1, -1), extent - 1 - after, 1))
    else:  # wrap: the leading border copies the input's last ``before`` positions, the trailing its first
        if before:
            parts.append(place(cut(0, before), extent - before, 0))
        if after:
            parts.append(place(cut(before + extent, SLICE_END), 0, extent - after))
    return parts[0] if len(parts) == 1 else b.op("Sum", *parts)


def _uncopy_runtime(ctx: Context, g: str, mode: str, rank: int | None, axes: list[int] | None) -> str:
    """The adjoint of reflect, edge and wrap padding whose pads or extents are known only at
    run time: along each padded axis, output position ``o`` copies input position
    ``index(o - begin)`` (edge: held within the extent; reflect: mirrored about both ends,
    once; wrap: modulo the extent), and its gradient is added there."""
    if mode not in ("reflect", "edge", "wrap"):
        raise ctx.error(f"unknown Pad mode {mode!r}")
    if rank is None:
        raise ctx.error(f"mode {mode!r} with pads known only at run time needs its input's rank", dynamic=True)
    b, x = ctx.b, ctx.I(0)
    axes = list(range(rank)) if axes is None else axes
    grad = g
    for k, axis in enumerate(axes):
        count = extent(b, x, axis)
        begin = b.op("Gather", ctx.I(1), b.const(np.array(k, np.int64)), axis=0)
        source = b.op("Sub", positions(b, extent(b, grad, axis)), begin)
        if mode == "edge":
            index = clipped(b, source, count)
        elif mode == "reflect":  # |o| mirrors the leading border, last - |last - |o|| the trailing one
            last = b.op("Sub", count, b.const(np.array(1, np.int64)))
            index = b.op("Sub", last, b.op("Abs", b.op("Sub", last, b.op("Abs", source))))
        else:
            index = b.op("Mod", source, count)
        grad = scattered(b, grad, rank, axis, count, [(index, None)])
    return grad
