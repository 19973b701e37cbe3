"""Gradient rules: elementwise ops (unary, broadcasting binary and variadic), and ops with no gradient.

Unary rules are one line: ``unary(op, d)`` with ``d(ctx, b)`` building dy/dx
(from ``I(0)`` and ``O(0)``) that multiplies ``GO(0)`` (a quotient divides instead: no
``Reciprocal``, which has no bfloat16 CUDA kernel); ``masked(op, m)`` passes
``GO(0)`` where the mask holds and zero elsewhere (``Where``, so an inf or NaN
gradient never meets a zero factor). Broadcasting inputs get their gradient
summed back to their own shape by ``ctx.unbroadcast``.

Where the derivative is a function of the output (Exp, Sqrt, Sigmoid, Tanh; Relu, LeakyRelu
and Elu through the output's sign), the rule reads the output, not the input: the input is
then read by nothing after the forward, so the runtime frees it early and may fuse the op
that makes it with the activation (ONNX Runtime fuses Conv+Relu only where the Conv's output
has no other reader).
"""

from __future__ import annotations

import math

from amp_rewrite.autodiff.context import Context
from amp_rewrite.autodiff.registry import no_gradient, register
from amp_rewrite.ir.builder import GraphBuilder


def unary(op: str, derivative, since: int = 1, constant: tuple[int, ...] = ()) -> None:
    """GI(0) = GO(0) * derivative(ctx, b)."""

    @register(op, since=since, constant=constant)
    def build(ctx: Context):
        return {0: ctx.b.op("Mul", ctx.GO(0), derivative(ctx, ctx.b))}


def masked(op: str, mask, constant: tuple[int, ...] = ()) -> None:
    """GI(0) = GO(0) where mask(ctx, b) holds, else 0."""

    @register(op, constant=constant)
    def build(ctx: Context):
        return {0: where(ctx, mask(ctx, ctx.b), ctx.go_or_zeros(0))}


def where(ctx: Context, condition: str, grad: str, otherwise: str | None = None) -> str:
    """``grad`` where ``condition`` holds, else ``otherwise`` (zero by default)."""
    return ctx.b.op("Where", condition, grad, otherwise or ctx.b.const(0.0, like=grad))


def _zero(ctx: Context) -> str:
    return ctx.b.const(0.0, like=ctx.I(0))


# -- unary ------------------------------------------------------------------------------------------
register("Identity")(lambda ctx: {0: ctx.GO(0)})
register("Neg")(lambda ctx: {0: ctx.b.op("Neg", ctx.GO(0))})
unary("Abs", lambda ctx, b: b.op("Sign", ctx.I(0)))
unary("Exp", lambda ctx, b: ctx.O(0))
register("Log")(lambda ctx: {0: ctx.b.op("Div", ctx.GO(0), ctx.I(0))})
unary("Sqrt", lambda ctx, b: b.op("Div", b.const(0.5, like=ctx.O(0)), ctx.O(0)))
unary("Reciprocal", lambda ctx, b: b.op("Neg", b.op("Mul", ctx.O(0), ctx.O(0))))
unary("Sigmoid", lambda ctx, b: b.op("Mul", ctx.O(0), b.op("Sub", b.const(1.0, like=ctx.O(0)), ctx.O(0))))
unary("Tanh", lambda ctx, b: b.op("Sub", b.const(1.0, like=ctx.O(0)), b.op("Mul", ctx.O(0), ctx.O(0))))
unary("Erf", lambda ctx, b: b.op("Mul", b.const(2 / math.sqrt(math.pi), like=ctx.I(0)),
                                 b.op("Exp", b.op("Neg", b.op("Mul", ctx.I(0), ctx.I(0))))))
unary("Softplus", lambda ctx, b: b.op("Sigmoid", ctx.I(0)))
unary("Sin", lambda ctx, b: b.op("Cos", ctx.I(0)))
unary("Cos", lambda ctx, b: b.op("Neg", b.op("Sin", ctx.I(0))))
register("Softsign")(lambda ctx: {0: ctx.b.op("Div", ctx.GO(0), _square(ctx.b, ctx.b.op(
    "Add", ctx.b.const(1.0, like=ctx.I(0)), ctx.b.op("Abs", ctx.I(0)))))})
masked("Relu", lambda ctx, b: b.op("Greater", ctx.O(0), b.const(0.0, like=ctx.O(0))))


def _square(b: GraphBuilder, x: str) -> str:
    return b.op("Mul", x, x)


@register("HardSigmoid")
def _hard_sigmoid(ctx: Context):
    b = ctx.b
    inside = b.op("And", b.op("Greater", ctx.O(0), _zero(ctx)), b.op("Less", ctx.O(0), b.const(1.0, like=ctx.O(0))))
    return {0: where(ctx, inside, ctx.scale(ctx.go_or_zeros(0), ctx.attr("alpha", 0.2)))}


@register("LeakyRelu")
def _leaky_relu(ctx: Context):
    alpha, g = ctx.attr("alpha", 0.01), ctx.go_or_zeros(0)
    positive = _positive_input(ctx, alpha >= 0)
    return {0: where(ctx, positive, g, ctx.scale(g, alpha))}


@register("Elu")
def _elu(ctx: Context):
    b, y, g = ctx.b, ctx.O(0), ctx.go_or_zeros(0)
    alpha = ctx.attr("alpha", 1.0)
    positive = _positive_input(ctx, alpha >= 0)
    return {0: where(ctx, positive, g, b.op("Mul", g, b.op("Add", y, b.const(alpha, like=y))))}


def _positive_input(ctx: Context, by_output: bool) -> str:
    """x > 0, from the output where ``by_output`` (an activation whose output is positive exactly
    where its input is), else from the input."""
    value = ctx.O(0) if by_output else ctx.I(0)
    return ctx.b.op("Greater", value, ctx.b.const(0.0, like=value))


@register("HardSwish")
def _hard_swish(ctx: Context):
    """y = x * clip(x/6 + 1/2, 0, 1): dy/dx is 0 below -3, 1 above 3, x/3 + 1/2 between."""
    b, x, g = ctx.b, ctx.I(0), ctx.go_or_zeros(0)
    slope = b.op("Add", b.op("Div", x, b.const(3.0, like=x)), b.const(0.5, like=x))
    inner = b.op("Mul", g, slope)
    return {0: where(ctx, b.op("Greater", x, b.const(3.0, like=x)), g,
                     where(ctx, b.op("Less", x, b.const(-3.0, like=x)), b.const(0.0, like=g), inner))}


@register("Clip", since=11, constant=(1, 2))
def _clip(ctx: Context):
    return {0: where(ctx, _inside(ctx, ctx.I(1) or None, ctx.I(2) or None), ctx.go_or_zeros(0))}


def _inside(ctx: Context, low: str | None, high: str | None) -> str:
    b, x = ctx.b, ctx.I(0)
    tests = ([b.op("GreaterOrEqual", x, low)] if low else []) + ([b.op("LessOrEqual", x, high)] if high else [])
    if not tests:
        return b.op("Equal", x, x)
    return tests[0] if len(tests) == 1 else b.op("And", *tests)


@register("Pow", constant=(1,))
def _pow(ctx: Context):
    """d(x^p)/dx = p * x^(p-1), the exponent a constant (cast like the base)."""
    b, x = ctx.b, ctx.I(0)
    p = ctx.I(1) if b.types.get(ctx.I(1)) == b.types[x] else b.op("Cast", ctx.I(1), to=b.types[x])
    slope = b.op("Mul", p, b.op("Pow", x, b.op("Sub", p, b.const(1.0, like=x))))
    return {0: ctx.unbroadcast(b.op("Mul", ctx.GO(0), slope), x, ctx.O(0))}


@register("PRelu")
def _prelu(ctx: Context):
    b, x, slope = ctx.b, ctx.I(0), ctx.I(1)
    positive = b.op("Greater", x, _zero(ctx))
    grads = {}
    if ctx.wants(0):
        g = ctx.go_or_zeros(0)
        grads[0] = ctx.unbroadcast(where(ctx, positive, g, b.op("Mul", g, slope)), x, ctx.O(0))
    if ctx.wants(1):
        grads[1] = ctx.unbroadcast(where(ctx, positive, b.const(0.0, like=x), b.op("Mul", ctx.GO(0), x)),
                                   slope, ctx.O(0))
    return grads


# -- broadcasting binary and variadic ---------------------------------------------------------------
@register("Add", "Sum")
def _add(ctx: Context):
    return {i: ctx.unbroadcast(ctx.go_or_zeros(0), ctx.I(i), ctx.O(0)) for i in range(ctx.input_count) if ctx.wants(i)}


@register("Mean")
def _mean(ctx: Context):
    share = ctx.scale(ctx.go_or_zeros(0), 1 / ctx.input_count)
    return {i: ctx.unbroadcast(share, ctx.I(i), ctx.O(0)) for i in range(ctx.input_count) if ctx.wants(i)}


@register("Sub")
def _sub(ctx: Context):
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.unbroadcast(ctx.go_or_zeros(0), ctx.I(0), ctx.O(0))
    if ctx.wants(1):
        grads[1] = ctx.b.op("Neg", ctx.unbroadcast(ctx.go_or_zeros(0), ctx.I(1), ctx.O(0)))  # negated once summed
    return grads


@register("Mul")
def _mul(ctx: Context):
    b = ctx.b
    return {i: ctx.unbroadcast(b.op("Mul", ctx.GO(0), ctx.I(1 - i)), ctx.I(i), ctx.O(0))
            for i in (0, 1) if ctx.wants(i)}


@register("Div")
def _div(ctx: Context):
    b, y = ctx.b, ctx.O(0)
    grads = {}
    over = b.op("Div", ctx.GO(0), ctx.I(1))
    if ctx.wants(0):
        grads[0] = ctx.unbroadcast(over, ctx.I(0), y)
    if ctx.wants(1):  # d(a/b)/db = -(a/b)/b, negated once summed
        grads[1] = b.op("Neg", ctx.unbroadcast(b.op("Mul", over, y), ctx.I(1), y))
    return grads


@register("Max", "Min")
def _select(ctx: Context):
    """The gradient goes to the input whose value was selected."""
    b = ctx.b
    return {i: ctx.unbroadcast(where(ctx, b.op("Equal", ctx.I(i), ctx.O(0)), ctx.go_or_zeros(0)), ctx.I(i), ctx.O(0))
            for i in range(ctx.input_count) if ctx.wants(i)}


@register("Where")
def _where(ctx: Context):
    b, g = ctx.b, ctx.GO(0)
    zero = b.const(0.0, like=g)
    grads = {}
    if ctx.wants(1):
        grads[1] = ctx.unbroadcast(b.op("Where", ctx.I(0), g, zero), ctx.I(1), ctx.O(0))
    if ctx.wants(2):
        grads[2] = ctx.unbroadcast(b.op("Where", ctx.I(0), zero, g), ctx.I(2), ctx.O(0))
    return grads


@register("Cast")
@register("CastLike", constant=(1,))
def _cast(ctx: Context):
    """The gradient returns to the input's type: a float32 weight read through a Cast to
    float16 gets a float32 gradient. Where a rule computed that gradient in the input's type
    and cast it for the Cast's output, the uncast value is the gradient (no round trip through
    float16, which a batch-wide per-channel sum times the loss scale would overflow)."""
    x, g, b = ctx.I(0), ctx.GO(0), ctx.b
    made = b.made_by.get(g) if g else None
    if made is not None and made.op_type == "Cast" and b.types.get(made.input[0]) == b.types[x]:
        return {0: made.input[0]}
    return {0: b.op("Cast", g, to=b.types[x])}


no_gradient("Floor", "Ceil", "Round", "Sign", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "EyeLike",
            "Range", "OneHot")
