"""What a gradient rule sees of its node: ``I``, ``O``, ``GO``, attributes, static shapes, a builder.

The vocabulary is defined in :mod:`amp_rewrite.autodiff.registry`. Shapes are
static where shape inference found them (ints, names, or None per dimension)
and None otherwise; rules fall back to runtime ``Shape`` values when a shape
they need is not static, so symbolic batch and sequence dimensions work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder
from amp_rewrite.ir.graph import ModelIndex, Node, ValueKey

SLICE_END = 2**62
"""A Slice bound past any extent."""




class NoParameters(UserError):
    """The loss depends on no float initializer: there is nothing to differentiate."""


class DynamicShapes(UserError):
    """A rule needs what only run time knows here (a shape, pads or scales computed from one):
    a graph specialized to fixed input extents, its shape computations folded, has them."""

class Engine(Protocol):
    """What rules reach of the backward pass (``backward.Backward``) through their context: the
    model's index, the formulation asked for, shapes and constants, and, for control-flow bodies,
    the values a node's subgraphs read from outside (``closure``) and a backward run over a body."""

    index: ModelIndex
    conv_weight_grad: str

    def closure(self, node: Node) -> list[ValueKey]: ...

    def key_of(self, graph_id: int, name: str) -> ValueKey | None: ...

    def constant(self, graph_id: int, name: str) -> np.ndarray | None: ...

    def shape(self, graph_id: int, name: str) -> tuple | None: ...

    def run(self, graph_id: int, seeds: dict[ValueKey, str], targets: Sequence[ValueKey],
            b: GraphBuilder) -> Mapping[ValueKey, str]: ...


class Context:
    def __init__(self, engine: Engine, node: Node, graph_id: int, b: GraphBuilder,
                 inputs: Sequence[str], grads: Sequence[str | None], wanted: Sequence[bool]) -> None:
        self.engine = engine
        self.indexed = node
        self.node = node.proto
        self.graph_id = graph_id
        self.b = b
        self._inputs = list(inputs)
        self._grads = list(grads)
        self._wanted = list(wanted)
        self._attributes = {a.name: helper.get_attribute_value(a) for a in node.proto.attribute}

    # -- the vocabulary ----------------------------------------------------------------------------
    def I(self, i: int) -> str:  # noqa: E743, N802 (the registry's vocabulary)
        return self._inputs[i] if i < len(self._inputs) else ""

    def O(self, i: int) -> str:  # noqa: E743, N802
        return self.node.output[i] if i < len(self.node.output) else ""

    def GO(self, i: int) -> str | None:  # noqa: N802
        return self._grads[i] if i < len(self._grads) else None

    def wants(self, i: int) -> bool:
        """Whether input ``i`` needs a gradient (it depends on a parameter)."""
        return i < len(self._wanted) and self._wanted[i]

    @property
    def input_count(self) -> int:
        return len(self._inputs)

    @property
    def opset(self) -> int:
        return self.b.opset

    @property
    def conv_weight_grad(self) -> str:
        """``add_backward``'s choice of Conv weight-gradient formulation (``direct`` by default)."""
        return self.engine.conv_weight_grad

    def attr(self, name: str, default=None):
        value = self._attributes.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def error(self, why: str, dynamic: bool = False) -> UserError:
        """The error for a node this rule cannot differentiate, naming it; ``dynamic``: because a
        shape or a shape-derived operand is known only at run time (``DynamicShapes``)."""
        return (DynamicShapes if dynamic else UserError)(
            f"cannot differentiate {self.node.op_type} node {self.node.name or self.O(0)!r}: {why}")

    def go_or_zeros(self, i: int) -> str:
        """``GO(i)``, or zeros like ``O(i)`` when nothing flows into that output."""
        grad = self.GO(i)
        return grad if grad is not None else self.b.zeros_like(self.O(i))

    # -- shapes ------------------------------------------------------------------------------------
    def shape(self, name: str) -> tuple | None:
        return self.engine.shape(self.graph_id, name)

    def constant(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` when it is an initializer or a Constant's output."""
        return self.engine.constant(self.graph_id, self.I(i))

    def rank(self, name: str) -> int | None:
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape when every dimension is a known int."""
        shape = self.shape(name)
        if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        return tuple(shape)

    def shape_value(self, name: str) -> str:
        """The shape of ``name`` as an int64 value: a constant when static, else a ``Shape`` node."""
        static = self.static_shape(name)
        return self.b.ints(static) if static is not None else self.b.op("Shape", name)

    # -- the common shapes of rule -----------------------------------------------------------------
    def unbroadcast(self, grad: str, x: str, y: str | None = None) -> str:
        """Sum ``grad`` (shaped like the broadcast result ``y``) down to ``x``'s shape.

        When the shapes decide it (dimensions known, or named alike), the axes are
        constants: the leading axes ``x`` lacks, and those where ``x`` has extent 1 and
        ``y`` does not. Otherwise they are found at run time: every axis where ``x``'s
        shape, padded with leading ones to ``grad``'s rank, is 1 (summing an axis of
        extent 1 changes nothing).
        """
        b = self.b
        axes = self.broadcast_axes(x, y) if y else None
        if axes is not None:
            lead, ones = axes
            if ones:
                grad = b.reduce_sum(grad, ones, keepdims=1)
            return b.reduce_sum(grad, list(range(lead)), keepdims=0) if lead else grad
        x_dims, g_dims = b.op("Shape", x), b.op("Shape", grad)
        x_rank, g_rank = b.op("Shape", x_dims), b.op("Shape", g_dims)
        pad = b.op("ConstantOfShape", b.op("Sub", g_rank, x_rank),
                   value=onnx.numpy_helper.from_array(np.ones(1, np.int64)))
        padded = b.op("Concat", pad, x_dims, axis=0)
        found = b.op("Reshape", b.op("NonZero", b.op("Equal", padded, b.ints([1]))), b.ints([-1]))
        return b.op("Reshape", b.reduce_sum(grad, found, keepdims=1), x_dims)

    def broadcast_axes(self, x: str, y: str) -> tuple[int, list[int]] | None:
        """(leading axes, axes of extent 1 in ``x`` but not in ``y``) when ``x`` broadcasts to
        ``y`` in a way the static shapes decide, else None."""
        xs, ys = self.shape(x), self.shape(y)
        if xs is None or ys is None or len(ys) < len(xs):
            return None
        lead = len(ys) - len(xs)
        ones = []
        for i, d in enumerate(xs):
            e = ys[lead + i]
            if d == 1:
                if e != 1:
                    ones.append(lead + i)
            elif not (isinstance(d, int) and d > 1) and (d is None or d != e):
                return None  # a named or unknown extent that may be 1 at run time
        return lead, ones

    def scale(self, grad: str, factor: float) -> str:
        """``grad * factor`` (nothing when the factor is 1)."""
        return grad if factor == 1 else self.b.op("Mul", grad, self.b.const(factor, like=grad))


def total(b: GraphBuilder, parts: Sequence[str]) -> str:
    """One value for the contributions to a gradient: a single ``Sum`` of them all."""
    return parts[0] if len(parts) == 1 else b.op("Sum", *parts)
