"""Where the update's tensors lie: one set per parameter, or flat float32 buffers shared by all.

Per parameter (``build(flat_state="off")``), the step unscales, checks, clips and updates each
parameter's gradient with nodes of its own, and carries each optimizer state (and gradient sum of
``accumulation``) per parameter: every formula term is as many nodes as there are parameters, on a
GPU as many kernel launches (docs/training-speed.md, item 5). Flat ("on"), the float32
gradients are flattened (row-major) and concatenated in the parameters' order into one vector;
each optimizer state and the gradient sum is one carried vector in that layout; every formula term
is one node over all parameters, and every kept-or-updated choice one ``Where`` per vector. The
parameters stay tensors of their own (the forward reads them): they are concatenated alike for the
update, and its result is split back into them (one ``Split``, a ``Reshape`` each).

Both layouts are lists of ``Group``s (one per parameter, or one of them all), and the step's
assembly reads groups only. Invariant: both compute the same float32 bits. An elementwise term
gives each element the same value wherever it lies; the global-norm clip adds each parameter's
sum of squares, reduced from a tensor of its shape, in the parameters' order, in both layouts
(so the clip keeps a reduction per parameter). The exception is ONNX Runtime's: its basic graph
rewrites drop a Transpose that makes a gradient (a Conv weight's) before the per-parameter
layout's sum over all its elements, which then adds in another order, so a clipped step may
differ in the clip factor's last bit. The inf/NaN check sums the flat gradient at once: an inf or
NaN anywhere makes any sum of it inf or NaN, so the skipped flags agree but where finite
gradients' sum overflows float32 (which either layout takes for an inf).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder

FLAT_STATES = ("off", "on")
"""``build(flat_state=...)``'s choices: per-parameter tensors, or flat buffers."""
FLAT = "flat"
"""The flat buffers' names begin with it: ``flat.exp_avg``, ``flat.grad_sum``."""


def checked(flat_state: str) -> str:
    """``flat_state``, or a UserError naming the choices."""
    if flat_state not in FLAT_STATES:
        raise UserError(f"--flat-state must be one of {', '.join(FLAT_STATES)}, got {flat_state!r}")
    return flat_state


@dataclass(frozen=True)
class Buffer:
    """A carried float32 value of a group: its graph input's name and shape, and the parameter it
    belongs to (None for a flat buffer, which holds every parameter's)."""

    name: str
    shape: list[int]
    of: str | None


@dataclass(frozen=True)
class Group:
    """Parameters (name -> shape, in order) whose gradient, optimizer states and gradient sum are
    one tensor each: one parameter, shaped as it is, or, ``flat``, several flattened and
    concatenated in order."""

    shapes: Mapping[str, Sequence[int]]
    flat: bool

    def buffer(self, role: str) -> Buffer:
        """The group's carried value of ``role`` (an optimizer state's, or ``accumulation.SUM_ROLE``)."""
        if self.flat:
            return Buffer(f"{FLAT}.{role}", [sum(math.prod(s) for s in self.shapes.values())], None)
        ((param, shape),) = self.shapes.items()
        return Buffer(f"{param}.{role}", list(shape), param)

    def joined(self, b: GraphBuilder, values: Sequence[str]) -> str:
        """``values`` (one per parameter, in order, each shaped as it) as the group's one tensor."""
        if not self.flat:
            (value,) = values
            return value
        vector = b.ints([-1])
        return b.op("Concat", *(b.op("Reshape", value, vector) for value in values), axis=0)

    def split(self, b: GraphBuilder, value: str) -> list[str]:
        """The group's tensor ``value`` as one tensor per parameter, each shaped as it (``joined``'s inverse)."""
        if not self.flat:
            return [value]
        sizes = [math.prod(shape) for shape in self.shapes.values()]
        if len(sizes) == 1:
            pieces = [value]
        elif b.opset >= 13:
            pieces = b.ops("Split", value, b.ints(sizes), outputs=len(sizes), axis=0)
        else:
            pieces = b.ops("Split", value, outputs=len(sizes), axis=0, split=sizes)
        return [b.op("Reshape", piece, b.ints(list(shape))) for piece, shape in zip(pieces, self.shapes.values())]

    def square_sums(self, b: GraphBuilder, grad: str) -> list[str]:
        """Each parameter's sum of its squared gradient (float32 scalars) from the group's gradient
        ``grad``: one Mul, then a sum per parameter over a tensor of its shape, the reduction the
        per-parameter layout runs (a float sum's bits depend on the order it adds in)."""
        return [b.axes_op("ReduceSum", piece, None, keepdims=0) for piece in self.split(b, b.op("Mul", grad, grad))]


def groups(flat_state: str, shapes: Mapping[str, Sequence[int]]) -> list[Group]:
    """The layout ``flat_state`` names for the parameters ``shapes`` (name -> shape, in order): a
    group per parameter ("off"), or one group of them all ("on")."""
    if checked(flat_state) == "on":
        return [Group(dict(shapes), flat=True)]
    return [Group({param: shape}, flat=False) for param, shape in shapes.items()]
