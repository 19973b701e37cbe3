"""Gradient rules: matrix products (MatMul with numpy's broadcasting and 1-D rules, Gemm)."""

from __future__ import annotations

from amp_rewrite.autodiff.context import Context
from amp_rewrite.autodiff.registry import register


def _transposed(ctx: Context, x: str, rank: int) -> str:
    """``x`` with its last two axes swapped."""
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return ctx.b.op("Transpose", x, perm=perm)


@register("MatMul")
def _matmul(ctx: Context):
    """dA = dY @ B^T and dB = A^T @ dY over broadcast batch axes, summed back to each input's
    shape; a 1-D operand is a row (A) or column (B) vector whose axis the product drops."""
    b, a, w, g = ctx.b, ctx.I(0), ctx.I(1), ctx.go_or_zeros(0)
    ra, rb = ctx.rank(a), ctx.rank(w)
    if ra is None or rb is None:
        raise ctx.error("the ranks of its inputs are unknown (shape inference could not find them)", dynamic=True)
    if ra == 1 and rb == 1:
        return {i: b.op("Mul", g, ctx.I(1 - i)) for i in (0, 1) if ctx.wants(i)}
    # Make both operands at least 2-D, as MatMul does, and dY to match.
    a2 = b.axes_op("Unsqueeze", a, [0]) if ra == 1 else a
    w2 = b.axes_op("Unsqueeze", w, [1]) if rb == 1 else w
    g2 = b.axes_op("Unsqueeze", g, [-2]) if ra == 1 else g
    g2 = b.axes_op("Unsqueeze", g2, [-1]) if rb == 1 else g2
    ry = max(ra, rb, 2)
    grads = {}
    if ctx.wants(0):
        da = b.op("MatMul", g2, _transposed(ctx, w2, max(rb, 2)))
        grads[0] = _sum_to(ctx, da, a, ry - 2, squeeze=-2 if ra == 1 else None)
    if ctx.wants(1):
        weight_shape = ctx.static_shape(w)
        if rb == 2 and ra >= 2 and weight_shape is not None:
            # A matrix weight under a batch of rows: one Gemm over the rows flattened, no batch sum.
            rows_a = a if ra == 2 else b.op("Reshape", a, b.ints([-1, weight_shape[0]]))
            rows_g = g if ra == 2 else b.op("Reshape", g, b.ints([-1, weight_shape[1]]))
            grads[1] = b.op("Gemm", rows_a, rows_g, transA=1)
        else:
            dw = b.op("MatMul", _transposed(ctx, a2, max(ra, 2)), g2)
            grads[1] = _sum_to(ctx, dw, w, ry - 2, squeeze=-1 if rb == 1 else None)
    return grads


def _sum_to(ctx: Context, grad: str, x: str, batch: int, squeeze: int | None) -> str:
    """Sum a product gradient (``batch`` broadcast batch axes, then ``x``'s matrix axes) over the
    batch axes ``x`` does not have or has with extent 1; a vector operand loses its matrix axis."""
    b = ctx.b
    if squeeze is not None:
        return b.reduce_sum(b.axes_op("Squeeze", grad, [squeeze]), list(range(batch)), keepdims=0)
    x_shape, y_shape = ctx.shape(x), ctx.shape(ctx.O(0))
    assert x_shape is not None  # the caller knows x's rank
    lead = batch - (len(x_shape) - 2)
    ones = []
    for i, d in enumerate(x_shape[:-2]):
        e = y_shape[lead + i] if y_shape is not None and len(y_shape) == batch + 2 else None
        if d == 1 and e != 1:
            ones.append(lead + i)
        elif d != 1 and not (isinstance(d, int) and d > 1) and (d is None or d != e):
            return ctx.unbroadcast(grad, x)  # a named extent that may be 1 at run time: decide then
    if ones:
        grad = b.reduce_sum(grad, ones, keepdims=1)
    return b.reduce_sum(grad, list(range(lead)), keepdims=0) if lead else grad


@register("Gemm")
def _gemm(ctx: Context):
    """Y = alpha * A' @ B' + beta * C with A' = A or A^T, B' = B or B^T; each gradient is a Gemm."""
    b, a, w, g = ctx.b, ctx.I(0), ctx.I(1), ctx.go_or_zeros(0)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    ta, tb = ctx.attr("transA", 0), ctx.attr("transB", 0)
    grads = {}
    if ctx.wants(0):
        grads[0] = (b.op("Gemm", w, g, alpha=alpha, transA=tb, transB=1) if ta
                    else b.op("Gemm", g, w, alpha=alpha, transA=0, transB=1 - tb))
    if ctx.wants(1):
        grads[1] = (b.op("Gemm", g, a, alpha=alpha, transA=1, transB=ta) if tb
                    else b.op("Gemm", a, g, alpha=alpha, transA=1 - ta, transB=0))
    if ctx.wants(2):
        grads[2] = ctx.unbroadcast(ctx.scale(g, beta), ctx.I(2), ctx.O(0))
    return grads
