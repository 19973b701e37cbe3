"""Gradient rules: convolution, pooling and LRN.

Windowed ops (Conv, ConvTranspose, the pools) share one geometry, :class:`Window`:
kernel, strides, dilations and the pads the op really applies (``auto_pad``
resolved from the static input shape). Two adjoints serve them all:

- the gradient of a sum over windows with respect to what the windows read is
  a ``ConvTranspose`` of GO with the same strides, dilations and groups,
  cropped (symmetric pads, then ``Slice``) or extended (``output_padding``) to
  exactly the input's spatial size (:func:`_window_adjoint`); asymmetric
  ConvTranspose pads are avoided because ONNX Runtime's CUDA provider sends
  them back to the CPU;
- the gradient of a convolution with respect to its kernel is a ``Conv`` of
  one operand by the other with batch and channel axes swapped, the forward's
  strides as dilations and its dilations as strides, cut to the kernel's size
  (:func:`_weight_grad`); with static shapes, ``add_backward``'s
  ``conv_weight_grad`` option can build it as a grouped split-K Conv, a
  ConvTranspose or an im2col MatMul instead (:mod:`.conv_weight_grad`).

MaxPool scatters GO to the positions its ``Indices`` output names (adding that
output to the forward node when it has none); AveragePool spreads GO divided by
each window's divisor. Pad and Resize have modules of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from amp_rewrite.autodiff.context import Context
from amp_rewrite.autodiff.conv_weight_grad import FORMULATIONS, ConvShape, batch_major, choose
from amp_rewrite.autodiff.registry import register

Dims = tuple[int, ...]


def _spatial(ctx: Context, name: str) -> Dims | None:
    """The static extents of ``name``'s axes after batch and channel, or None."""
    shape = ctx.shape(name)
    if shape is None or len(shape) < 2 or not all(isinstance(d, int) and d >= 0 for d in shape[2:]):
        return None
    return tuple(shape[2:])


def _spatial_value(ctx: Context, name: str) -> str:
    """The extents of ``name``'s spatial axes as an int64 value."""
    return ctx.b.op("Shape", name, start=2)


# -- window geometry ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """Where a windowed op reads: window ``o`` of axis ``i`` covers the (padded) input positions
    ``o * strides[i] - begin[i] + k * dilations[i]`` for ``k < kernel[i]``."""

    kernel: Dims
    strides: Dims
    dilations: Dims
    begin: Dims
    end: Dims

    def span(self, i: int) -> int:
        return self.dilations[i] * (self.kernel[i] - 1) + 1

    def out_size(self, spatial: Dims, ceil_mode: bool = False) -> Dims:
        """The output extents of a convolution (or a pool, with ``ceil_mode``) over ``spatial``."""
        sizes = []
        for i, extent in enumerate(spatial):
            room, stride = extent + self.begin[i] + self.end[i] - self.span(i), self.strides[i]
            size = (-(-room // stride) if ceil_mode else room // stride) + 1
            if ceil_mode and (size - 1) * stride >= extent + self.begin[i]:
                size -= 1  # the last window starts inside the input or its leading pad
            sizes.append(size)
        return tuple(sizes)

    @property
    def attrs(self) -> dict:
        return {"strides": list(self.strides), "dilations": list(self.dilations)}


def _window(ctx: Context, kernel: Dims, spatial: Dims | None) -> Window:
    """The node's window with ``auto_pad`` resolved into explicit pads."""
    n = len(kernel)
    strides = tuple(ctx.attr("strides") or (1,) * n)
    dilations = tuple(ctx.attr("dilations") or (1,) * n)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if spatial is None:
            raise ctx.error(f"auto_pad={auto_pad} pads by the input's spatial shape, which is not static here; "
                            "give the input static spatial dimensions or the node explicit pads", dynamic=True)
        spans = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
        total = [max(0, (-(-s // st) - 1) * st + span - s) for s, st, span in zip(spatial, strides, spans)]
        small, large = tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
        begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    elif auto_pad == "VALID":
        begin = end = (0,) * n
    else:
        pads = tuple(ctx.attr("pads") or (0,) * (2 * n))
        begin, end = pads[:n], pads[n:]
    return Window(tuple(kernel), strides, dilations, begin, end)


def _kernel(ctx: Context, weight: str) -> Dims:
    kernel = ctx.attr("kernel_shape")
    if kernel:
        return tuple(kernel)
    found = _spatial(ctx, weight)
    if found is None:
        raise ctx.error("its kernel shape is neither an attribute nor a static weight shape")
    return found


def _out_spatial(ctx: Context, win: Window, spatial: Dims | None, ceil_mode: bool = False) -> Dims | None:
    found = _spatial(ctx, ctx.O(0))
    if found is not None:
        return found
    return win.out_size(spatial, ceil_mode) if spatial is not None else None


# -- the two adjoints ---------------------------------------------------------------------------------
def _window_adjoint(ctx: Context, grad: str, weight: str, win: Window, x: str, spatial: Dims | None,
                    out: Dims | None, group: int = 1) -> str:
    """Each window's gradient (``grad``, N x M x out) sent back through ``weight`` (M x C/group x
    kernel) to the positions it read: a ConvTranspose shaped exactly like ``x`` (N x C x spatial)."""
    b = ctx.b
    attrs = dict(win.attrs, group=group if group > 1 else None)
    axes = list(range(2, 2 + len(win.kernel)))
    if spatial is not None and out is not None:
        # The un-padded ConvTranspose covers padded positions [0, full); x is [begin, begin + extent).
        full = [(o - 1) * s + win.span(i) for i, (o, s) in enumerate(zip(out, win.strides))]
        excess = [f - p - e for f, p, e in zip(full, win.begin, spatial)]
        trim = [max(0, min(p, x_)) for p, x_ in zip(win.begin, excess)]
        extra = [max(0, -x_) for x_ in excess]
        y = b.op("ConvTranspose", grad, weight, pads=trim + trim,
                 output_padding=extra if any(extra) else None, **attrs)
        starts = [p - t for p, t in zip(win.begin, trim)]
        ends = [s + e for s, e in zip(starts, spatial)]
        made = [f + x_ - 2 * t for f, x_, t in zip(full, extra, trim)]
        if starts == [0] * len(starts) and ends == made:
            return y
        return b.op("Slice", y, b.ints(starts), b.ints(ends), b.ints(axes))
    # Spatial extents known only at run time: pad the full result by stride - 1 (enough for the
    # remainder the windows did not reach), then cut the input's extent out of it.
    y = b.op("ConvTranspose", grad, weight, **attrs)
    if max(win.strides) > 1:
        y = b.op("Pad", y, b.ints([0] * (2 + len(axes)) + [0, 0] + [s - 1 for s in win.strides]))
    stops = b.op("Add", b.ints(win.begin), _spatial_value(ctx, x))
    return b.op("Slice", y, b.ints(win.begin), stops, b.ints(axes))


def _weight_grad(ctx: Context, a: str, a_spatial: Dims | None, channels: int, other: str,
                 other_spatial: Dims | None, group: int, strides: Dims, dilations: Dims, begin: Dims, end: Dims,
                 kernel: Dims, *, batch: int | None = None, filters: int | None = None) -> str:
    """sum over n and positions of ``a`` (N x channels x ...) against ``other`` (N x B x ...) at
    each kernel offset: a Conv with the batch as its contraction axis, shaped B x channels/group
    x kernel (the weight of a Conv reading ``a`` and writing ``other``, or of a ConvTranspose
    reading ``other`` and writing ``a``). ``batch`` N and ``filters`` B, where static, let the
    context's ``conv_weight_grad`` option choose another formulation (:mod:`.conv_weight_grad`)."""
    b = ctx.b
    shape = ConvShape(batch, channels, filters, group, kernel, strides=dilations, dilations=strides, begin=begin,
                      end=end, spatial=a_spatial, out=other_spatial, elem_type=b.types.get(a))
    choice = choose(shape, ctx.conv_weight_grad)
    if choice.formulation != "direct":
        return FORMULATIONS[choice.formulation](b, a, other, shape)
    n = len(kernel)
    swap = [1, 0, *range(2, 2 + n)]
    lhs = batch_major(b, a, channels, group, a_spatial, n)
    rhs = b.op("Transpose", other, perm=swap)
    y = b.op("Conv", lhs, rhs, group=group if group > 1 else None, strides=list(strides),
             dilations=list(dilations), pads=list(begin) + list(end))
    y = b.op("Transpose", y, perm=swap)
    if a_spatial is not None and other_spatial is not None:
        made = [(sa + p + e - (d * (so - 1) + 1)) // st + 1
                for sa, so, p, e, d, st in zip(a_spatial, other_spatial, begin, end, dilations, strides)]
        if made == list(kernel):
            return y
    # The windows' remainder (or, without static extents, possibly nothing) past the kernel: cut it.
    return b.op("Slice", y, b.ints([0] * n), b.ints(kernel), b.ints(list(range(2, 2 + n))))


def _bias_grad(ctx: Context, grad: str, n: int) -> str:
    return ctx.b.reduce_sum(grad, [0, *range(2, 2 + n)], keepdims=0)


# -- convolutions -------------------------------------------------------------------------------------
@register("Conv")
def _conv(ctx: Context):
    """Y = X (*) W + B, windows per ``Window``; dX a ConvTranspose of GO with W, dW a Conv of X
    with GO, dB the sum of GO over all axes but channels."""
    x, w, g = ctx.I(0), ctx.I(1), ctx.go_or_zeros(0)
    group = ctx.attr("group", 1)
    kernel = _kernel(ctx, w)
    spatial = _spatial(ctx, x)
    win = _window(ctx, kernel, spatial)
    grads = {}
    if ctx.wants(0):
        grads[0] = _window_adjoint(ctx, g, w, win, x, spatial, _out_spatial(ctx, win, spatial), group)
    if ctx.wants(1):
        grads[1] = _weight_grad(ctx, x, spatial, _channels(ctx, x, w, 1, group), g, _out_spatial(ctx, win, spatial),
                                group, strides=win.dilations, dilations=win.strides, begin=win.begin, end=win.end,
                                kernel=kernel, batch=_batch(ctx, x), filters=_known_channels(ctx, ctx.O(0), w, 0, 1))
    if ctx.wants(2):
        grads[2] = _bias_grad(ctx, g, len(kernel))
    return grads


def _batch(ctx: Context, x: str) -> int | None:
    shape = ctx.shape(x)
    return shape[0] if shape and isinstance(shape[0], int) else None


def _channels(ctx: Context, x: str, w: str, axis: int, group: int) -> int:
    """Channels of ``x``: from its static shape, else from the weight's (``w.shape[axis] * group``)."""
    found = _known_channels(ctx, x, w, axis, group)
    if found is None:
        raise ctx.error("the channel count is neither in its input's nor its weight's static shape")
    return found


def _known_channels(ctx: Context, x: str, w: str, axis: int, group: int) -> int | None:
    shape, w_shape = ctx.shape(x), ctx.shape(w)
    if shape is not None and len(shape) > 1 and isinstance(shape[1], int):
        return shape[1]
    if w_shape is not None and isinstance(w_shape[axis], int):
        return w_shape[axis] * group
    return None


@register("ConvTranspose")
def _conv_transpose(ctx: Context):
    """Y = ConvTranspose(X, W) + B; dX a Conv of GO with W (same strides, pads, dilations, group),
    dW a Conv of GO with X, dB the sum of GO over all axes but channels."""
    b, x, w, g = ctx.b, ctx.I(0), ctx.I(1), ctx.go_or_zeros(0)
    group = ctx.attr("group", 1)
    kernel = _kernel(ctx, w)
    n = len(kernel)
    spatial, out = _spatial(ctx, x), _spatial(ctx, ctx.O(0))
    strides = tuple(ctx.attr("strides") or (1,) * n)
    dilations = tuple(ctx.attr("dilations") or (1,) * n)
    extra = tuple(ctx.attr("output_padding") or (0,) * n)
    begin, end = _transpose_pads(ctx, kernel, strides, dilations, extra, spatial)
    grads = {}
    if ctx.wants(0):
        dx = b.op("Conv", g, w, group=group if group > 1 else None, strides=list(strides),
                  dilations=list(dilations), pads=list(begin) + list(end))
        if any(e >= s for e, s in zip(extra, strides)):  # output_padding past a stride: Conv makes extra rows
            ends = b.ints(spatial) if spatial is not None else _spatial_value(ctx, x)
            dx = b.op("Slice", dx, b.ints([0] * n), ends, b.ints(list(range(2, 2 + n))))
        grads[0] = dx
    if ctx.wants(1):
        grads[1] = _weight_grad(ctx, g, out, _channels(ctx, ctx.O(0), w, 1, group), x, spatial, group,
                                strides=dilations, dilations=strides, begin=begin, end=end, kernel=kernel,
                                batch=_batch(ctx, x), filters=_known_channels(ctx, x, w, 0, 1))
    if ctx.wants(2):
        grads[2] = _bias_grad(ctx, g, n)
    return grads


def _transpose_pads(ctx: Context, kernel: Dims, strides: Dims, dilations: Dims, extra: Dims,
                    spatial: Dims | None) -> tuple[Dims, Dims]:
    """The pads a ConvTranspose crops from its full result (explicit, or from ``output_shape`` or
    ``auto_pad`` as the ONNX spec computes them)."""
    n = len(kernel)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    target = ctx.attr("output_shape")
    if auto_pad == "VALID":
        return (0,) * n, (0,) * n
    if target is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        pads = tuple(ctx.attr("pads") or (0,) * (2 * n))
        return pads[:n], pads[n:]
    if spatial is None:
        raise ctx.error("its pads follow from auto_pad or output_shape and the input's spatial shape, "
                        "which is not static here", dynamic=True)
    target = list(target)[-n:] if target is not None else [s * st for s, st in zip(spatial, strides)]
    total = [st * (s - 1) + e + d * (k - 1) + 1 - t
             for s, st, e, d, k, t in zip(spatial, strides, extra, dilations, kernel, target)]
    if any(t < 0 for t in total):
        raise ctx.error(f"output_shape {target} is larger than the transposed convolution makes")
    small, large = tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
    return (small, large) if auto_pad == "SAME_UPPER" else (large, small)


# -- pools --------------------------------------------------------------------------------------------
@register("MaxPool", since=8)
def _max_pool(ctx: Context):
    """GO scattered (added) into zeros like X at the flat positions of MaxPool's ``Indices``
    output, which is added to the forward node when it has none."""
    b, x, node = ctx.b, ctx.I(0), ctx.node
    indices = node.output[1] if len(node.output) > 1 else ""
    if indices and ctx.attr("storage_order", 0) != 0:
        raise ctx.error("its Indices output is column-major (storage_order=1); the gradient needs row-major "
                         "indices")
    if not indices:
        indices = b.names.fresh(f"{ctx.O(0)}_indices")
        if len(node.output) > 1:
            node.output[1] = indices
        else:
            node.output.append(indices)
        b.types[indices] = TensorProto.INT64
        for attribute in node.attribute:
            if attribute.name == "storage_order":
                attribute.i = 0  # nothing else reads the new Indices: make them row-major
    flat = b.op("Reshape", b.zeros_like(x), b.ints([-1]))
    spread = b.op("ScatterElements", flat, b.op("Reshape", indices, b.ints([-1])),
                  b.op("Reshape", ctx.GO(0), b.ints([-1])), axis=0, reduction="add")
    return {0: b.op("Reshape", spread, ctx.shape_value(x))}


@register("AveragePool")
def _average_pool(ctx: Context):
    """Each output's gradient divided by its window's divisor, spread over the window (a
    ConvTranspose with a ones kernel over N*C single-channel images). The divisor is the
    kernel's size unless pads are excluded from it (count_include_pad=0) or ceil_mode cuts the
    last windows short; then it varies per position, see :func:`_inverse_divisors`."""
    x, g = ctx.I(0), ctx.go_or_zeros(0)
    kernel = tuple(ctx.attr("kernel_shape"))
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    spatial = _spatial(ctx, x)
    win = _window(ctx, kernel, spatial)
    out = _out_spatial(ctx, win, spatial, ceil_mode)
    padded = any(win.begin) or any(win.end)
    if not ceil_mode and (ctx.attr("count_include_pad", 0) or not padded):
        scaled = ctx.scale(g, 1 / math.prod(kernel))
    else:
        scaled = ctx.b.op("Mul", g, _inverse_divisors(ctx, x, win, spatial, out, ceil_mode))
    return {0: _spread(ctx, scaled, x, win, spatial, out)}


def _inverse_divisors(ctx: Context, x: str, win: Window, spatial: Dims | None, out: Dims | None,
                      ceil_mode: bool) -> str:
    """1 / divisor of every window (1 x 1 x out), whatever convention the runtime counts pads
    and cut-short windows by: the same AveragePool over ones gives inside/divisor, a Conv of
    ones with a ones kernel over zero padding gives inside (the input positions in the window)."""
    b = ctx.b
    shape = b.ints([1, 1, *spatial]) if spatial is not None else b.op("Concat", b.ints([1, 1]),
                                                                       _spatial_value(ctx, x), axis=0)
    ones = ctx.b.ones(shape, x)
    attrs = {a.name: helper.get_attribute_value(a) for a in ctx.node.attribute}
    ratio = b.op("AveragePool", ones, **attrs)
    end = [e + (s - 1 if ceil_mode else 0) for e, s in zip(win.end, win.strides)]
    kernel = b.const(np.ones((1, 1, *win.kernel)), like=x)
    inside = b.op("Conv", ones, kernel, pads=list(win.begin) + end, **win.attrs)
    if ceil_mode:  # the extra pad makes enough windows; keep the pool's
        n = len(win.kernel)
        ends = b.ints(out) if out is not None else _spatial_value(ctx, ctx.O(0))
        inside = b.op("Slice", inside, b.ints([0] * n), ends, b.ints(list(range(2, 2 + n))))
    return b.op("Div", ratio, inside)


def _spread(ctx: Context, grad: str, x: str, win: Window, spatial: Dims | None, out: Dims | None) -> str:
    """Each output's gradient added over its window: the adjoint of a sum pool, per channel."""
    b = ctx.b
    tail = b.ints(out) if out is not None else _spatial_value(ctx, grad)
    images = b.op("Reshape", grad, b.op("Concat", b.ints([-1, 1]), tail, axis=0))
    kernel = b.const(np.ones((1, 1, *win.kernel)), like=x)
    spread = _window_adjoint(ctx, images, kernel, win, x, spatial, out)
    return b.op("Reshape", spread, ctx.shape_value(x))


@register("GlobalAveragePool")
def _global_average_pool(ctx: Context):
    b, x = ctx.b, ctx.I(0)
    spatial = _spatial(ctx, x)
    if spatial is not None:
        count = b.const(float(math.prod(spatial)), like=x)
    else:
        count = b.op("Cast", b.op("Div", b.op("Size", x), b.op("Size", ctx.O(0))), to=b.types[x])
    return {0: b.op("Expand", b.op("Div", ctx.GO(0), count), ctx.shape_value(x))}


@register("GlobalMaxPool")
def _global_max_pool(ctx: Context):
    """GO goes to the elements equal to their channel's maximum."""
    b, x = ctx.b, ctx.I(0)
    grad = b.op("Where", b.op("Equal", x, ctx.O(0)), ctx.GO(0), b.const(0.0, like=x))
    return {0: grad}


# -- LRN ----------------------------------------------------------------------------------------------
@register("LRN")
def _lrn(ctx: Context):
    """Y = X * D^-beta with D = bias + alpha/size * (window sum over channels of X^2), the window
    [c - lo, c + hi] (lo = floor((size-1)/2), hi = ceil((size-1)/2)):
    dX = GO * D^-beta - 2 alpha beta / size * X * (mirrored window sum of GO * Y / D)."""
    b, x, y, g = ctx.b, ctx.I(0), ctx.O(0), ctx.GO(0)
    size = ctx.attr("size")
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    lo = (size - 1) // 2
    hi = size - 1 - lo
    rank = ctx.rank(x)
    if rank is None:
        raise ctx.error("the rank of its input is not known")
    mean = _channel_window_mean(ctx, b.op("Mul", x, x), size, lo, hi, rank)
    d = b.op("Add", ctx.scale(mean, alpha), b.const(bias, like=x))
    direct = b.op("Mul", g, b.op("Pow", d, b.const(-beta, like=x)))
    back = _channel_window_mean(ctx, b.op("Div", b.op("Mul", g, y), d), size, hi, lo, rank)
    return {0: b.op("Sub", direct, b.op("Mul", x, ctx.scale(back, 2 * alpha * beta)))}


def _channel_window_mean(ctx: Context, v: str, size: int, before: int, after: int, rank: int) -> str:
    """sum of ``v`` over channels [c - before, c + after] (clipped) / size: an AveragePool
    counting pads, over the channel axis made spatial."""
    b = ctx.b
    lifted = b.axes_op("Unsqueeze", v, [1])
    pooled = b.op("AveragePool", lifted, kernel_shape=[size] + [1] * (rank - 2),
                  pads=[before] + [0] * (rank - 2) + [after] + [0] * (rank - 2), count_include_pad=1)
    return b.axes_op("Squeeze", pooled, [1])
