"""Gradient rules: softmax, losses, normalisation and dropout.

Softmax and LogSoftmax differentiate from their output ``O(0)``. The losses
(SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss) turn ``GO(0)`` into one
coefficient per label position (reduction, class weight, ``ignore_index``) and
put it at the label's class with ``ScatterElements``; class weights are
constants. The normalisations share :class:`Normalised`: the statistics of
``I(0)`` over the normalised axes, recomputed in the forward's element type
(the precision policy chooses that type; no rule casts to float32), and the one
backward ``dx = inv_std * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat))``
with ``g_hat = GO(0) * scale``. Inference-mode BatchNormalization differentiates
every input, its mean and variance too (a training step computes them from the batch:
``training.batch_statistics``), and LayerNormalization its Mean and InvStdDev outputs;
the running statistics that training-mode BatchNormalization reads and outputs are
buffers and carry no gradient. BatchNormalization's per-channel sums over a 16-bit
input are LayerNormalization means, accumulated in float32 (``_channel_sums``). Dropout's
training-mode gradient reads the node's own mask output, which the rule adds to
the forward node when the model did not ask for it (LayerNormalization's rule adds the
Mean output so).

Emitted ops: Add, Sub, Mul, Div, Neg, Sqrt, Exp, Where, Equal, ReduceSum,
ReduceMean, Softmax (only when a loss's log-probabilities are not an output),
Gather, ScatterElements, Unsqueeze, Reshape, Expand, Shape, Size, ConstantOfShape,
LayerNormalization (opset 17 on, statistics in float32), Cast (between the types of
two operands, or a count to the statistics' type). All have CUDA kernels for float16,
float32 and bfloat16 (Equal on the integer labels only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from onnx import TensorProto

from amp_rewrite.autodiff.context import Context, total
from amp_rewrite.autodiff.registry import register
from amp_rewrite.ir.builder import LOW_TYPES


# -- shared helpers ---------------------------------------------------------------------------------
def _rank(ctx: Context, x: str) -> int:
    rank = ctx.rank(x)
    if rank is None:
        raise ctx.error("the rank of its input is unknown (shape inference could not find it)")
    return rank


def _trailing_axes(ctx: Context, x: str, axis: int) -> list[int]:
    """``axis`` and every axis after it (negative axes need no rank)."""
    return list(range(axis, 0)) if axis < 0 else list(range(axis, _rank(ctx, x)))


def _like(ctx: Context, value: str, ref: str) -> str:
    """``value`` in ``ref``'s element type (a Cast only when they differ: BatchNormalization's
    scale and statistics may have their own types)."""
    b = ctx.b
    wanted = b.types.get(ref)
    return value if wanted is None or b.types.get(value) == wanted else b.op("Cast", value, to=wanted)


def _per_channel(ctx: Context, p: str, rank: int) -> str:
    """A per-channel vector ``[C]`` shaped ``[C, 1, ..., 1]`` to broadcast against ``[N, C, ...]``."""
    return ctx.b.axes_op("Unsqueeze", p, list(range(1, rank - 1))) if rank > 2 else p


class Normalised:
    """``x`` normalised over ``axes``: ``x_hat = (x - mean) * inv_std`` with
    ``inv_std = 1 / sqrt(var + epsilon)`` and the biased variance, statistics kept over the
    reduced axes (keepdims) and computed in ``x``'s element type."""

    def __init__(self, ctx: Context, x: str, axes: Sequence[int], epsilon: float) -> None:
        b = self.b = ctx.b
        self.axes = list(axes)
        centred = b.op("Sub", x, b.axes_op("ReduceMean", x, self.axes, keepdims=1))
        var = b.axes_op("ReduceMean", b.op("Mul", centred, centred), self.axes, keepdims=1)
        std = b.op("Sqrt", b.op("Add", var, b.const(epsilon, like=x)))
        self.inv_std = b.op("Div", b.const(1.0, like=x), std)
        self.x_hat = b.op("Mul", centred, self.inv_std)

    def backward(self, g_hat: str) -> str:
        """dL/dx from ``g_hat`` = dL/dx_hat: the mean and variance depend on every element."""
        b = self.b
        mean_g = b.axes_op("ReduceMean", g_hat, self.axes, keepdims=1)
        mean_gx = b.axes_op("ReduceMean", b.op("Mul", g_hat, self.x_hat), self.axes, keepdims=1)
        inner = b.op("Sub", b.op("Sub", g_hat, mean_g), b.op("Mul", self.x_hat, mean_gx))
        return b.op("Mul", inner, self.inv_std)


# -- softmax ----------------------------------------------------------------------------------------
def _softmax_axes(ctx: Context) -> list[int]:
    """Opset 13 on: the one ``axis`` (default -1). Before: the input coerced to 2-D at ``axis``
    (default 1), so every axis from it on."""
    if ctx.opset >= 13:
        return [ctx.attr("axis", -1)]
    return _trailing_axes(ctx, ctx.I(0), ctx.attr("axis", 1))


def _softmax_rule(op: str, grad) -> None:
    for since, until in ((1, 12), (13, None)):
        register(op, since=since, until=until)(lambda ctx: {0: grad(ctx, _softmax_axes(ctx))})


def _softmax_grad(ctx: Context, axes: list[int]) -> str:
    """dx = y * (g - sum(g * y))."""
    b, y, g = ctx.b, ctx.O(0), ctx.GO(0)
    return b.op("Mul", y, b.op("Sub", g, b.reduce_sum(b.op("Mul", g, y), axes, keepdims=1)))


def _log_softmax_grad(ctx: Context, axes: list[int]) -> str:
    return _log_softmax_backward(ctx, ctx.b.op("Exp", ctx.O(0)), ctx.go_or_zeros(0), axes)


def _log_softmax_backward(ctx: Context, prob: str, g: str, axes: list[int]) -> str:
    """dx = g - softmax * sum(g), with ``prob`` the softmax (exp of the log-probabilities)."""
    b = ctx.b
    return b.op("Sub", g, b.op("Mul", prob, b.reduce_sum(g, axes, keepdims=1)))


_softmax_rule("Softmax", _softmax_grad)
_softmax_rule("LogSoftmax", _log_softmax_grad)


# -- losses -----------------------------------------------------------------------------------------
def _label_coefficients(ctx: Context, g: str) -> tuple[str, str]:
    """(labels safe to index with, dL/d(-log p at the label)) for a loss over ``I(1)``: the output
    gradient spread over the label positions by the reduction, times each position's class
    weight, zero where the label is ``ignore_index``. With weights (or ignored labels) the mean
    divides by the sum of the weights of the labels kept, else by the number of labels."""
    b, scores, labels = ctx.b, ctx.I(0), ctx.I(1)
    reduction, ignore = ctx.attr("reduction", "mean"), ctx.attr("ignore_index")
    safe, weights = labels, None
    if ignore is not None:  # ignore_index may lie outside [0, C): index with class 0 there
        ignored = b.op("Equal", labels, b.const(ignore, like=labels))
        safe = b.op("Where", ignored, b.const(0, like=labels), labels)
    if ctx.I(2):
        weights = b.op("Gather", ctx.I(2), safe)
    if ignore is not None:
        weights = b.op("Where", ignored, b.const(0.0, like=scores), weights or b.const(1.0, like=scores))
    if reduction == "mean":
        shape = ctx.static_shape(labels)
        if weights is not None:
            count = b.op("ReduceSum", weights, keepdims=0)
        elif shape is not None:
            count = b.const(float(math.prod(shape)), like=scores)
        else:
            count = b.op("Cast", b.op("Size", labels), to=b.types[scores])
        g = b.op("Div", g, count)
    if weights is not None:
        return safe, b.op("Mul", weights, g)
    return safe, g if reduction == "none" else b.op("Expand", g, ctx.shape_value(labels))


def _at_labels(ctx: Context, labels: str, coefficients: str) -> str:
    """Zeros like the scores with ``coefficients`` at each position's label class (axis 1)."""
    b = ctx.b
    return b.op("ScatterElements", b.zeros_like(ctx.I(0)), b.axes_op("Unsqueeze", labels, [1]),
                b.axes_op("Unsqueeze", coefficients, [1]), axis=1)


@register("SoftmaxCrossEntropyLoss", since=13, constant=(2,))
def _softmax_cross_entropy(ctx: Context):
    """loss = -w[label] * log_softmax(scores, 1)[label]: d scores = u * (softmax - onehot(label));
    the log-probabilities output (if read) adds LogSoftmax's gradient. (From opset 13, where
    ``Softmax(axis=1)`` normalises axis 1 alone; version 12 differs only in its types.)"""
    b, scores = ctx.b, ctx.I(0)
    prob = b.op("Exp", ctx.O(1)) if ctx.O(1) else b.op("Softmax", scores, axis=1)
    parts = []
    if (loss_grad := ctx.GO(0)) is not None:
        labels, u = _label_coefficients(ctx, loss_grad)
        spread = b.op("Mul", prob, b.axes_op("Unsqueeze", u, [1]))
        parts.append(b.op("Sub", spread, _at_labels(ctx, labels, u)))
    if (log_prob_grad := ctx.GO(1)) is not None:
        parts.append(_log_softmax_backward(ctx, prob, log_prob_grad, [1]))
    return {0: parts[0] if len(parts) == 1 else b.op("Add", *parts)}


@register("NegativeLogLikelihoodLoss", since=12, constant=(2,))
def _negative_log_likelihood(ctx: Context):
    """loss = -w[label] * input[label]: d input = -u at the label."""
    labels, u = _label_coefficients(ctx, ctx.go_or_zeros(0))
    return {0: ctx.b.op("Neg", _at_labels(ctx, labels, u))}


# -- normalisation ----------------------------------------------------------------------------------
@register("BatchNormalization", since=14)
def _batch_norm(ctx: Context):
    """Inference (``training_mode`` 0): ``y = scale * (x - mean) * r + B`` with ``r = 1/sqrt(var +
    epsilon)`` per channel, each input differentiated (the mean and variance are constants of a
    trained model, but a training step computes them from the batch). Training: normalised by the
    batch statistics over N and the spatial axes; the running statistics it reads and outputs are
    buffers (no gradient flows through them)."""
    b, x, scale, g = ctx.b, ctx.I(0), ctx.I(1), ctx.GO(0)
    if g is None:
        return {}
    rank = _rank(ctx, x)
    axes = [0, *range(2, rank)]
    epsilon = ctx.attr("epsilon", 1e-5)
    if ctx.attr("training_mode", 0):
        grads = {2: _like(ctx, b.reduce_sum(g, axes, keepdims=0), ctx.I(2))} if ctx.wants(2) else {}
        if ctx.wants(0) or ctx.wants(1):
            norm = Normalised(ctx, x, axes, epsilon)
            if ctx.wants(0):
                grads[0] = norm.backward(b.op("Mul", g, _per_channel(ctx, _like(ctx, scale, x), rank)))
            if ctx.wants(1):
                grads[1] = _like(ctx, b.reduce_sum(b.op("Mul", g, norm.x_hat), axes, keepdims=0), scale)
        return grads
    return _inference_batch_norm(ctx, g, rank, epsilon)


def _inference_batch_norm(ctx: Context, g: str, rank: int, epsilon: float) -> dict[int, str]:
    """The affine map's gradients: ``dx = g * scale * r``; ``dB = sum(g)``; ``dscale = sum(g * x_hat)``;
    ``dmean = -scale * r * sum(g)``; ``dvar = -scale * r^2 / 2 * sum(g * x_hat)``, the sums
    (``_channel_sums``) over N and the spatial axes."""
    b, x, scale = ctx.b, ctx.I(0), ctx.I(1)
    inv_std = b.op("Div", b.const(1.0, like=x),
                   b.op("Sqrt", b.op("Add", _like(ctx, ctx.I(4), x), b.const(epsilon, like=x))))
    factor = b.op("Mul", _like(ctx, scale, x), inv_std)
    grads = {}
    if ctx.wants(0):
        grads[0] = b.op("Mul", g, _per_channel(ctx, factor, rank))
    if ctx.wants(2) or ctx.wants(3):
        sum_g = _channel_sums(ctx, g, rank)
        if ctx.wants(2):
            grads[2] = _like(ctx, sum_g, ctx.I(2))
        if ctx.wants(3):
            grads[3] = _like(ctx, b.op("Neg", b.op("Mul", sum_g, _like(ctx, factor, sum_g))), ctx.I(3))
    if ctx.wants(1) or ctx.wants(4):
        centred = b.op("Sub", x, _per_channel(ctx, _like(ctx, ctx.I(3), x), rank))
        sum_gx = _channel_sums(ctx, b.op("Mul", g, b.op("Mul", centred, _per_channel(ctx, inv_std, rank))), rank)
        if ctx.wants(1):
            grads[1] = _like(ctx, sum_gx, scale)
        if ctx.wants(4):
            slope = b.op("Mul", _like(ctx, factor, sum_gx), _like(ctx, inv_std, sum_gx))
            grads[4] = _like(ctx, b.op("Mul", sum_gx, b.op("Mul", slope, b.const(-0.5, like=sum_gx))), ctx.I(4))
    return grads


def _channel_sums(ctx: Context, t: str, rank: int) -> str:
    """Sums of ``t`` ([N, C, ...]) over N and the spatial axes, [C]. Where ``t`` is a 16-bit float,
    has spatial axes and the opset has LayerNormalization, they are taken in float32: each (n, c)'s
    mean is LayerNormalization's Mean output over the spatial axes (float32; its kernels
    accumulate in float), times the spatial extent, summed over N. A 16-bit ReduceSum would hold
    the sum in 16 bits (past 65504 it overflows; CUDA's also rounds a mean's float32 sum to 16 bits
    before dividing). Elsewhere a ReduceSum in ``t``'s type."""
    b = ctx.b
    axes = [0, *range(2, rank)]
    if rank < 3 or ctx.opset < 17 or b.types.get(t) not in LOW_TYPES:
        return b.reduce_sum(t, axes, keepdims=0)
    (row_means,) = b.row_statistics(t, 1)
    extent = b.op("Cast", b.op("Div", b.op("Size", t), b.op("Size", row_means)), to=b.types[row_means])
    return b.op("Mul", b.reduce_sum(row_means, axes, keepdims=0), extent)


@register("InstanceNormalization", since=6)
def _instance_norm(ctx: Context):
    """Normalised over the spatial axes of each (n, c); scale and B per channel."""
    b, x, g = ctx.b, ctx.I(0), ctx.go_or_zeros(0)
    rank = _rank(ctx, x)
    norm = Normalised(ctx, x, range(2, rank), ctx.attr("epsilon", 1e-5))
    grads = _per_channel_affine(ctx, g, norm.x_hat, [0, *range(2, rank)])
    if ctx.wants(0):
        grads[0] = norm.backward(b.op("Mul", g, _per_channel(ctx, ctx.I(1), rank)))
    return grads


def _per_channel_affine(ctx: Context, g: str, x_hat: str, axes: list[int]) -> dict[int, str]:
    """Gradients of a per-channel ``scale`` (input 1) and bias (input 2): sums over ``axes``."""
    b, grads = ctx.b, {}
    if ctx.wants(1):
        grads[1] = b.reduce_sum(b.op("Mul", g, x_hat), axes, keepdims=0)
    if ctx.wants(2):
        grads[2] = b.reduce_sum(g, axes, keepdims=0)
    return grads


@register("LayerNormalization", since=17)
def _layer_norm(ctx: Context):
    """Normalised over ``axis`` and every axis after it; Scale and B broadcast against the
    normalised shape. The Mean and InvStdDev outputs (``_through_statistics``) pass their
    gradients to X alone."""
    b, x, scale, y, g = ctx.b, ctx.I(0), ctx.I(1), ctx.O(0), ctx.GO(0)
    axes = _trailing_axes(ctx, x, ctx.attr("axis", -1))
    epsilon = ctx.attr("epsilon", 1e-5)
    grads, parts = {}, []
    if g is not None:
        norm = Normalised(ctx, x, axes, epsilon)
        if ctx.wants(0):
            parts.append(norm.backward(b.op("Mul", g, scale)))
        if ctx.wants(1):
            grads[1] = ctx.unbroadcast(b.op("Mul", g, norm.x_hat), scale, y)
        if ctx.wants(2):
            grads[2] = ctx.unbroadcast(g, ctx.I(2), y)
    if ctx.wants(0) and (ctx.GO(1) is not None or ctx.GO(2) is not None):
        parts.append(_through_statistics(ctx))
    if parts:
        grads[0] = total(b, parts)
    return grads


def _through_statistics(ctx: Context) -> str:
    """dL/dX from the Mean (``m``) and InvStdDev (``s = 1/sqrt(var + epsilon)``) outputs, over the
    D normalised elements of each row: ``dm/dx = 1/D`` and ``ds/dx = -s^3 (x - m) / D``, so
    ``dx = a + c * (x - m)`` with ``a = GO(1) / D`` and ``c = -GO(2) s^3 / D``. The per-row
    coefficients are computed in the statistics' type (``stash_type``) and cast to X's: every
    tensor shaped like X keeps X's type."""
    b, x = ctx.b, ctx.I(0)
    stats = _statistics_type(ctx)
    count = b.op("Cast", b.op("Div", b.op("Size", x), b.op("Size", ctx.O(1) or ctx.O(2))), to=stats)
    grad = None
    if (g_inv_std := ctx.GO(2)) is not None:
        inv_std = ctx.O(2)
        cube = b.op("Mul", inv_std, b.op("Mul", inv_std, inv_std))
        slope = b.op("Div", b.op("Mul", g_inv_std, cube), b.op("Neg", count))
        grad = b.op("Mul", b.op("Sub", x, _like(ctx, _row_means(ctx, stats), x)), _like(ctx, slope, x))
    if (g_mean := ctx.GO(1)) is not None:
        shift = _like(ctx, b.op("Div", g_mean, count), x)
        grad = b.op("Add", grad, shift) if grad is not None else b.op("Expand", shift, ctx.shape_value(x))
    assert grad is not None  # the caller found a gradient at Mean or InvStdDev
    return grad


def _statistics_type(ctx: Context) -> int:
    """The element type of the Mean and InvStdDev outputs: their ``stash_type`` (float32 by default)."""
    stats = ctx.attr("stash_type", TensorProto.FLOAT)
    for output in (ctx.O(1), ctx.O(2)):
        if output:
            ctx.b.types.setdefault(output, stats)
    return stats


def _row_means(ctx: Context, stats: int) -> str:
    """The node's Mean output; one is added to the forward node where it has none (the kernel's
    own statistic, where a ReduceMean in X's type could overflow)."""
    if ctx.O(1):
        return ctx.O(1)
    name = ctx.b.names.fresh(f"{ctx.node.output[0]}_mean")
    ctx.node.output[1] = name  # InvStdDev, output 2, is there
    ctx.b.types[name] = stats
    return name


def _group_norm(per_channel: bool):
    """Normalised over the channels of each group and the spatial axes (``x`` seen as
    ``[N, G, -1]``); scale and bias per group (opset 18) or per channel (opset 21)."""

    def build(ctx: Context):
        b, x, scale, g = ctx.b, ctx.I(0), ctx.I(1), ctx.go_or_zeros(0)
        groups = b.ints([0, ctx.attr("num_groups"), -1])
        norm = Normalised(ctx, b.op("Reshape", x, groups), [2], ctx.attr("epsilon", 1e-5))
        if per_channel:
            rank = _rank(ctx, x)
            x_hat = b.op("Reshape", norm.x_hat, ctx.shape_value(x))
            grads = _per_channel_affine(ctx, g, x_hat, [0, *range(2, rank)])
            g_hat = b.op("Reshape", b.op("Mul", g, _per_channel(ctx, scale, rank)), groups) if ctx.wants(0) else ""
        else:
            g = b.op("Reshape", g, groups)
            grads = _per_channel_affine(ctx, g, norm.x_hat, [0, 2])
            g_hat = b.op("Mul", g, b.axes_op("Unsqueeze", scale, [1])) if ctx.wants(0) else ""
        if ctx.wants(0):
            grads[0] = b.op("Reshape", norm.backward(g_hat), ctx.shape_value(x))
        return grads

    return build


register("GroupNormalization", since=18, until=20)(_group_norm(per_channel=False))
register("GroupNormalization", since=21)(_group_norm(per_channel=True))


# -- dropout ----------------------------------------------------------------------------------------
@register("Dropout", since=12, constant=(1,))
def _dropout(ctx: Context):
    """Inference (no ``training_mode``, false, or ratio 0): the identity. Training:
    GI = GO * mask / (1 - ratio) with the forward's own mask; a ``training_mode`` known only
    at run time selects between the two with ``Where``."""
    b, g = ctx.b, ctx.go_or_zeros(0)
    mode = ctx.constant(2) if ctx.I(2) else False
    ratio = ctx.constant(1) if ctx.I(1) else 0.5
    if (mode is not None and not bool(mode)) or (ratio is not None and float(ratio) == 0):
        return {0: g}
    if ratio is not None:
        kept = ctx.scale(g, 1 / (1 - float(ratio)))
    else:
        kept = b.op("Div", g, b.op("Sub", b.const(1.0, like=g), _like(ctx, ctx.I(1), g)))
    grad = b.op("Where", _dropout_mask(ctx), kept, b.const(0.0, like=g))
    return {0: grad if mode is not None else b.op("Where", ctx.I(2), grad, g)}


def _dropout_mask(ctx: Context) -> str:
    """The node's mask output; one is added to the forward node when it has none."""
    if ctx.O(1):
        return ctx.O(1)
    name = ctx.b.names.fresh(f"{ctx.node.output[0]}_mask")
    if len(ctx.node.output) > 1:
        ctx.node.output[1] = name
    else:
        ctx.node.output.append(name)
    ctx.b.types[name] = TensorProto.BOOL
    return name
