"""Rules: the elementwise ops (every op whose inputs broadcast), Expand, MatMul, Gemm, Concat,
Tile and Transpose: dimensions that must be equal (or 1, broadcasting).

Broadcasting (elementwise ops, Expand to a constant or Shape-computed target, MatMul's batch
dimensions) against one fixed extent above 1 (a Tile or Expand of a constant reaches here
through its inferred shape), and dimensions that must be equal (Concat's off its axis, MatMul's
and Gemm's contracted ones), bind the names there. A Concat of several names on its axis is
their sum, and a fixed extent it meets gives the one name left unknown, or when guessing the
last of them, the others at their least; a product that meets a fixed extent there is a count:
LeNet's Flatten into a Gemm of 864 inputs is 6 x h x w = 864; two named dimensions that meet
there are a count that any guess must keep: a Conv's and a MaxPool's output of the same input
agree at some of its extents only. An elementwise op or Expand gives its output, where
inference left a fresh name, the dimension of each column that is not 1 (``batch`` beside a
sliced 1). Tile by constant repeats multiplies; Transpose permutes.
"""

from __future__ import annotations

from collections.abc import Sequence

from amp_rewrite.inputs.dims.counting import Solver
from amp_rewrite.inputs.dims.registry import rule
from amp_rewrite.inputs.dims.reshape import product_dim
from amp_rewrite.inputs.dims.slicing import constant_ints, shape_value
from amp_rewrite.inputs.dims.symbols import Dim, Sym
from amp_rewrite.ir.graph import Node


@rule("Expand", broadcasting=True)
def _broadcast(rules: Solver, node: Node) -> None:
    shapes: list[Sequence[Dim] | None] = [rules.shape(key) for key in node.inputs if key is not None]
    if node.op_type == "Expand":  # the target: constant or computed from Shapes (a product: not followed)
        target = shape_value(rules, node.inputs[1]) if len(node.inputs) > 1 else None
        shapes[1:] = [None if target is None else [None if isinstance(d, tuple) else d for d in target]]
    if all(s is not None for s in shapes):
        columns = _aligned(shapes)
        rules.agree(columns, f"{node.op_type} {node.label!r}", broadcast=True)
        rules.derive(node.outputs[0] if node.outputs else None,
                     [_broadcast_dim(column, rules.equal_broadcasts) for column in columns])


def _broadcast_dim(column: Sequence[Dim], guessing: bool = False) -> Dim:
    """The dimension that broadcasting ``column`` gives: the one that is not 1 where they agree
    (``batch`` and 1 give ``batch``); when guessing, the first of several names (``x[2]`` and
    ``y[2]`` added are taken as equal: once one is bound, broadcasting binds the other); else None."""
    wider = set(column) - {1}
    if not wider:
        return 1
    if len(wider) == 1 and None not in wider:
        return next(iter(wider))
    return next(d for d in column if d != 1) if guessing and all(isinstance(d, Sym) for d in wider) else None


@rule("Concat")
def _concat(rules: Solver, node: Node) -> None:
    found = [rules.shape(key) for key in node.inputs if key is not None]
    shapes = [s for s in found if s is not None]
    if not shapes or len(shapes) != len(found) or any(len(s) != len(shapes[0]) for s in shapes):
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0) % max(len(shapes[0]), 1)
    rules.agree((column for i, column in enumerate(zip(*shapes)) if i != axis), f"Concat {node.label!r}")
    rules.derive(node.outputs[0],
                 [rules.sum_of(column) if i == axis else None for i, column in enumerate(zip(*shapes))])


@rule("Transpose")
def _transpose(rules: Solver, node: Node) -> None:
    """The output has the input's dimensions, permuted (reversed without ``perm``): the sum that a
    Concat of cached and new keys gives reaches the attention scores' MatMul through one."""
    data = rules.shape(node.inputs[0]) if node.inputs else None
    if data is None:
        return
    perm = next((list(a.ints) for a in node.proto.attribute if a.name == "perm"), None) or range(len(data))[::-1]
    if sorted(perm) == list(range(len(data))):
        rules.derive(node.outputs[0], [data[axis] for axis in perm])


@rule("Tile")
def _tile(rules: Solver, node: Node) -> None:
    """Each axis repeated by a constant: ``2 x batch`` (inference gives a repeated named axis a
    fresh name, even for a repeat of 1); a rounded one repeated is a product (``product_dim``:
    2 x (seq // 2) has no one-name form)."""
    data, repeats = rules.shape(node.inputs[0]), constant_ints(rules, node, 1)
    if data is not None and repeats is not None and len(repeats) == len(data):
        rules.derive(node.outputs[0], [product_dim(rules, node.outputs[0], axis, (d, int(r)))
                                       for axis, (d, r) in enumerate(zip(data, repeats))])


@rule("MatMul")
def _matmul(rules: Solver, node: Node) -> None:
    a, b = (rules.shape(key) for key in node.inputs[:2])
    if not a or not b:
        return
    origin = f"MatMul {node.label!r}"
    rules.agree([(a[-1], b[-2] if len(b) > 1 else b[0])], origin)
    columns = _aligned([a[:-2], b[:-2]])
    rules.agree(columns, origin, broadcast=True)
    if len(a) > 1 and len(b) > 1:  # the output: the broadcast leading dimensions, a's rows, b's columns
        rules.derive(node.outputs[0], [*(_broadcast_dim(c, rules.equal_broadcasts) for c in columns), a[-2], b[-1]])


@rule("Gemm")
def _gemm(rules: Solver, node: Node) -> None:
    """A's contracted dimension (its first where transA, else its second) equals B's (its second
    where transB, else its first)."""
    a, b = (rules.shape(key) for key in node.inputs[:2])
    if not a or not b or len(a) != 2 or len(b) != 2:
        return
    trans = {attr.name: attr.i for attr in node.proto.attribute if attr.name in ("transA", "transB")}
    rules.agree([(a[0 if trans.get("transA") else 1], b[1 if trans.get("transB") else 0])], f"Gemm {node.label!r}")


def _aligned(shapes: Sequence[Sequence[Dim] | None]) -> list[list[Dim]]:
    """Columns of right-aligned shapes (numpy broadcasting), each with the dims that reach it."""
    rank = max((len(s) for s in shapes if s is not None), default=0)
    return [[s[len(s) - rank + i] for s in shapes if s is not None and len(s) - rank + i >= 0]
            for i in range(rank)]
