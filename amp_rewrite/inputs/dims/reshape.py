"""Rules: Reshape and Flatten, and the shapes that a value was reshaped from.

Reshape to a constant shape without -1: the element counts agree (with the tensor it reshapes,
and with those that Reshapes before it reshaped, through nodes that keep the shape, Loops that
carry a value at its initial shape, MatMuls, whose fixed extents K and N scale the count by
K / N, and Gathers of constant indices, which leave out the picked axis' dimension), which
gives the one input dimension left unknown, offset or repeated too (``(batch + 1) x batch =
12``); with -1, the count is a multiple of the fixed extents, and the -1 is the count over the
others where that is one dimension (``[batch, batch]`` to ``[0, -1]`` is ``[batch, batch]``).

A fresh name for a product (Flatten's, a Reshape's -1 over several names, or a Reshape target
computed as ``Shape(x)[0] x Shape(x)[1]``) stands for the product, one name for each product
(``product_dim``): a fixed extent it meets is a count of its factors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import cast

from amp_rewrite.inputs.dims.counting import Solver
from amp_rewrite.inputs.dims.registry import rule
from amp_rewrite.inputs.dims.slicing import picked_by, shape_value
from amp_rewrite.inputs.dims.symbols import Dim, Sym, factors_of, multiplied
from amp_rewrite.ir.graph import Node, ValueKey


@rule("Reshape")
def _reshape(rules: Solver, node: Node) -> None:
    """The target's dimensions (constant, or computed from Shapes: ``shape_value``); a -1 takes
    what is left; a target dimension that is a product of names (Shape(x)[0] x Shape(x)[1]), and
    a -1 that takes several names, leave a fresh name standing for the product (``product_dim``)."""
    data = rules.shape(node.inputs[0])
    target = shape_value(rules, node.inputs[1]) if len(node.inputs) > 1 else None
    if data is None or target is None:
        return
    allowzero = any(a.name == "allowzero" and a.i for a in node.proto.attribute)
    if not allowzero and any(t == 0 and i >= len(data) for i, t in enumerate(target)):
        return
    result = [data[i] if t == 0 and not allowzero else t for i, t in enumerate(target)]
    missing = [i for i, t in enumerate(target) if t == -1]
    if len(missing) == 1:
        at = missing[0]
        result[at] = _left_over(data, factors_of(result[:at] + result[at + 1:]))
    rules.derive(node.outputs[0], [product_dim(rules, node.outputs[0], i, d) if isinstance(d, tuple) else d
                                   for i, d in enumerate(result)])
    known = [d for d, t in zip(result, target) if t != -1]
    for counted, times, per in _reshaped_from(rules, node.inputs[0]):
        if not missing:  # counted x per = result x times
            rules.same_count((*counted, per), (*factors_of(result), times), f"Reshape {node.label!r}")
        elif times == per:  # a -1 takes what is left: the count need only be a multiple of the rest
            rules.multiple_of(counted, factors_of(known), f"Reshape {node.label!r}")


def _left_over(data: Sequence[Dim], others: Sequence[Dim]) -> Dim | tuple[Dim, ...]:
    """What a Reshape's -1 takes: ``data``'s count over the product of the ``others`` (``batch``
    for [batch, batch] to [0, -1]; 2 x seq for [seq, 2] to [-1]; where several names are left,
    their product as ``multiplied`` gives it: (batch, seq, 2) for [batch, 1, seq, 4] to [2, -1], and
    (batch, seq, 1/2) for [batch, seq] to [2, -1])."""
    fixed, named = [1, 1], [Counter[Sym](), Counter[Sym]()]
    for side, dims in enumerate((data, others)):
        for dim in dims:
            if dim is None:
                return None
            if isinstance(dim, int):
                fixed[side] *= dim
            elif dim.offset or not dim.affine:
                named[side][dim] += 1
            else:
                fixed[side] *= dim.scale
                named[side][Sym(dim.name)] += 1
    left = named[0] - named[1]
    if named[1] - named[0] or fixed[1] <= 0 or (fixed[0] % fixed[1] and not left):
        return None
    if not left:
        return fixed[0] // fixed[1]
    # the fixed factor first, a fraction (``Dim`` says int: a product's last factor may be one)
    product: Dim | tuple[Dim, ...] = cast(Dim, Fraction(fixed[0], fixed[1]))
    for dim in left.elements():
        product = multiplied(product, dim)
    return product


def _reshaped_from(rules: Solver, key: ValueKey | None) -> Iterator[tuple[tuple[Dim, ...], int, int]]:
    """The shape of ``key`` and those that the Reshapes producing it reshaped, nearest first,
    through nodes whose first input has their output's shape (a Relu between two Reshapes),
    Loops whose carried value has its initial value's shape, MatMuls, and Gathers of constant
    indices (the gathered axis' dimension left out of every shape further back, while they
    hold it), each with (times, per): it holds ``key``'s count times ``times``, per ``per``
    (where a Reshape to [-1] left a fresh name, the one before it has names)."""
    times = per = 1
    gathered: list[Dim] = []
    while key is not None:
        shape = rules.shape(key)
        if shape is not None:
            shape = _leaving_out(shape, gathered)
            if shape is None:
                return
            yield shape, times, per
        producer = rules.index.producer_node(rules.index.values[key])
        source = rules.initial(key) or (producer.inputs[0] if producer is not None and producer.inputs else None)
        reshape = producer is not None and producer.op_type in ("Reshape", "Flatten") and producer.domain == ""
        if reshape or (shape is not None and rules.shape(source) == shape):
            key = source
        elif (contracted := _contracted(rules, producer, shape)) is not None:
            times, per, key = times * contracted[0], per * contracted[1], source
        elif (picked := picked_by(rules, producer)) is not None:
            gathered.append(picked[0])
            per, key = per * int(picked[1].size), source
        else:
            key = None


def product_dim(rules: Solver, key: ValueKey | None, position: int, dims: Sequence[Dim]) -> Dim:
    """The dimension at ``position`` of ``key`` that is the product of ``dims``: a fixed extent or
    one name scaled (``multiplied``); where several names meet, None, and the fresh name that
    inference gave there (``products``) stands for their product (the first such name for
    each product: the others are its aliases)."""
    product: Dim | tuple[Dim, ...] = 1
    for dim in dims:
        product = multiplied(product, dim)
    if not isinstance(product, tuple):
        return product
    inferred = rules.index.values[key].shape if key is not None else None
    name = inferred[position] if inferred is not None and position < len(inferred) else None
    if isinstance(name, str) and name not in rules.names and name not in rules.products:
        same = next((other for other, factors in rules.products.items() if Counter(factors) == Counter(product)), None)
        if same is None:
            rules.products[name] = tuple(product)
        else:  # one name for one product: two flattenings of x concatenated are 2 x (batch x seq)
            rules.aliases.setdefault(name, Sym(same))
    return None


@rule("Flatten")
def _flatten(rules: Solver, node: Node) -> None:
    """[d0, ..., dn] flattened at ``axis`` is [d0 x ... x d(axis - 1), d(axis) x ... x dn]
    (``product_dim``: a Gemm's weight after it fixes the count of the flattened dimensions)."""
    data = rules.shape(node.inputs[0])
    if data is None:
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 1)
    axis += len(data) if axis < 0 else 0
    if 0 <= axis <= len(data):
        rules.derive(node.outputs[0], [product_dim(rules, node.outputs[0], side, dims)
                                       for side, dims in enumerate((data[:axis], data[axis:]))])


def _leaving_out(shape: tuple[Dim, ...], dims: Sequence[Dim]) -> tuple[Dim, ...] | None:
    """``shape`` without one of its dimensions equal to each of ``dims``; None where one is missing."""
    left = list(shape)
    for dim in dims:
        if dim is None or dim not in left:
            return None
        left.remove(dim)
    return tuple(left)


def _contracted(rules: Solver, node: Node | None, shape: tuple[Dim, ...] | None) -> tuple[int, int] | None:
    """For a MatMul whose first input [..., K] has its output's [..., N] rank and leading
    dimensions, K and N fixed: (K, N), the elements the input holds for each N of the output's."""
    if node is None or node.op_type != "MatMul" or node.domain != "" or shape is None:
        return None
    first = rules.shape(node.inputs[0])
    if first is None or len(first) != len(shape) or len(shape) < 2 or first[:-1] != shape[:-1]:
        return None
    k, n = first[-1], shape[-1]
    return (k, n) if isinstance(k, int) and isinstance(n, int) and k > 0 and n > 0 else None
