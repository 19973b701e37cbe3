"""Rules: Slice, Split, Gather and Range, and the arithmetic of shape values (``Shape(x)[0] - 1``
is ``batch - 1``) that their bounds, a Reshape's target and an Expand's are read with.

Slice with constant starts and ends (``[1:]`` is ``batch - 1``) or ends computed from a Shape
(``x[:Shape(x)[0] - 1]``, where inference gives up on every axis) gives a dimension of a name.
Split into constant sizes: the axis holds their sum. A Gather of a constant index on a named
axis needs the axis to hold it (index 2 needs 3). A Range of a constant start and step holds
(limit - start) / step elements (a limit computed from a Shape gives a dimension); position
ids Range(0, seq) gathered from a table of N rows allow seq N at most: no guess exceeds it, and
a name that nothing binds takes it where the default is more.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from amp_rewrite.inputs.dims.counting import Solver
from amp_rewrite.inputs.dims.registry import rule
from amp_rewrite.inputs.dims.symbols import Dim, Sym, divided, multiplied, sliced, summed
from amp_rewrite.ir.graph import Node, ValueKey


def picked_by(rules: Solver, node: Node | None) -> tuple[Dim, np.ndarray] | None:
    """For a Gather of constant indices: the dimension of the axis it picks on, and the indices
    (its output holds its data's count over that dimension, times as many as there are)."""
    if node is None or node.op_type != "Gather" or node.domain != "" or len(node.inputs) < 2:
        return None
    data, indices = rules.shape(node.inputs[0]), rules.constant(node.inputs[1])
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    if data is None or indices is None or not -len(data) <= axis < len(data):
        return None
    return data[axis], indices


@rule("Range")
def _range(rules: Solver, node: Node) -> None:
    """Range of a constant start and step holds (limit - start) / step elements, rounded up: a
    limit computed from a Shape gives a dimension (position ids Range(0, Shape(x)[1]): seq)."""
    bounds = _range_bounds(rules, node)
    if bounds is None:
        return
    begin, end, step = bounds
    if isinstance(begin, int) and isinstance(step, int) and step >= 1 and not isinstance(end, tuple):
        length = divided(summed([end, -begin]), step - 1, step)
        rules.derive(node.outputs[0], [max(length, 0) if isinstance(length, int) else length])


def _range_bounds(rules: Solver, node: Node) -> tuple[Dim | tuple[Dim, ...], ...] | None:
    """A Range node's start, limit and step as dimensions (``shape_value``: a limit may come from a Shape)."""
    if node.domain != "" or len(node.inputs) != 3:
        return None
    values = [shape_value(rules, key) for key in node.inputs]
    firsts = [value[0] for value in values if value and len(value) == 1]
    return tuple(firsts) if len(firsts) == len(values) else None


@rule("Split")
def _split(rules: Solver, node: Node) -> None:
    """The axis holds the split sizes' sum (sizes [1, 2] make it 3; from its opset 13 an input,
    before an attribute), each output the size of its part; without sizes, a whole number of
    equal parts (before opset 18), or at least one element per part (``num_outputs``, each
    part but the last the axis over their number, rounded up)."""
    data = rules.shape(node.inputs[0])
    if data is None or not data:
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    if not -len(data) <= axis < len(data):
        return
    axis %= len(data)
    origin = f"Split {node.label!r}"
    sizes = constant_ints(rules, node, 1, "split")
    if sizes is not None and len(sizes) == len(node.outputs):
        rules.agree([(data[axis], int(sum(sizes)))], origin)
        for key, size in zip(node.outputs, sizes):
            rules.derive(key, [int(size) if i == axis else d for i, d in enumerate(data)])
    elif any(a.name == "num_outputs" for a in node.proto.attribute):
        parts = len(node.outputs)
        rules.at_least(data[axis], parts, f"for {origin}")
        part = divided(data[axis], parts - 1, parts)  # each but the last: the extent over the parts, rounded up
        for key in node.outputs[:-1]:
            rules.derive(key, [part if i == axis else d for i, d in enumerate(data)])
    elif sizes is None and (len(node.inputs) < 2 or node.inputs[1] is None):
        rules.multiple_of([data[axis]], [len(node.outputs)], origin)


@rule("Gather")
def _gather(rules: Solver, node: Node) -> None:
    """Constant indices on a named axis need it to hold them: index 2 (or -3) needs 3. Indices
    Range(0, d) (position ids, through Unsqueeze, Expand, Reshape or Cast) on an axis of fixed
    extent N need d to be N at most."""
    picked = picked_by(rules, node)
    if picked is not None and picked[1].size:
        rules.at_least(picked[0], max(int(picked[1].max()) + 1, -int(picked[1].min())), f"for Gather {node.label!r}")
    data = rules.shape(node.inputs[0]) if len(node.inputs) == 2 else None
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0)
    if data is None or not -len(data) <= axis < len(data) or not isinstance(extent := data[axis], int):
        return
    source = rules.index.producer_node(rules.index.value(node.inputs[1]))
    while source is not None and source.op_type in ("Unsqueeze", "Expand", "Reshape", "Cast") and source.inputs:
        source = rules.index.producer_node(rules.index.value(source.inputs[0]))
    bounds = _range_bounds(rules, source) if source is not None and source.op_type == "Range" else None
    if bounds is not None and bounds[0] == 0 and bounds[2] == 1 and not isinstance(limit := bounds[1], tuple):
        rules.at_most(limit, extent, f"for Gather {node.label!r}")  # (a product limits no one name)


@rule("Slice")
def _slice(rules: Solver, node: Node) -> None:
    """The sliced axes' extents; the others keep the input's (where ends computed from a Shape
    made inference give up on every axis). A named axis keeps at least one element (ONNX
    Runtime's ReduceMean of an empty slice kept the axes it reduced, and a Split after it failed)."""
    data, starts, ends = rules.shape(node.inputs[0]), _bounds(rules, node, 1, "starts"), _bounds(rules, node, 2, "ends")
    if data is None or starts is None or ends is None or len(starts) != len(ends):
        return
    axes = constant_ints(rules, node, 3, "axes", default=range(len(starts)))
    steps = constant_ints(rules, node, 4, default=[1] * len(starts))
    if axes is None or steps is None or not len(axes) == len(steps) == len(starts):
        return
    dims = list(data)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        if not -len(dims) <= axis < len(dims):
            return
        dims[axis] = sliced(data[axis], start, end, int(step))
        if isinstance(dims[axis], Sym):
            rules.at_least(dims[axis], 1, f"for Slice {node.label!r}")
    rules.derive(node.outputs[0], dims)


def _bounds(rules: Solver, node: Node, position: int,
            attribute: str) -> Sequence[Dim | tuple[Dim, ...]] | np.ndarray | None:
    """Slice's starts or ends: constants (input or attribute), or dimensions computed from a Shape."""
    if position < len(node.inputs) and node.inputs[position] is not None:
        return shape_value(rules, node.inputs[position])
    return constant_ints(rules, node, position, attribute)


SHAPE_ARITHMETIC = frozenset({"Shape", "Identity", "Cast", "Squeeze", "Unsqueeze", "Concat", "Gather", "Slice", "Add",
                              "Sub", "Mul"})
"""The ops through which ``shape_value`` follows a tensor of dimensions back to a Shape."""


def shape_value(rules: Solver, key: ValueKey | None) -> list[Dim | tuple[Dim, ...]] | None:
    """The elements of a small int tensor as dimensions: a constant's, or those a Shape gives
    (its start and end), through Identity, Cast, Squeeze, Unsqueeze, Concat, Gather of constant
    indices, Slice of constant bounds, Add or Sub of a constant (``Shape(x)[0] - 1`` is
    ``batch - 1``), and Mul (``multiplied``: a product of names is the tuple of its factors)."""
    constant = rules.constant(key)
    if constant is not None:
        return [int(v) for v in constant]
    node = rules.index.producer_node(rules.index.values[key]) if key is not None else None
    if node is None or node.domain != "" or node.op_type not in SHAPE_ARITHMETIC:
        return None
    op = node.op_type
    if op == "Shape":
        shape = rules.shape(node.inputs[0])
        attrs = {a.name: a.i for a in node.proto.attribute}
        return None if shape is None else list(shape[attrs.get("start", 0):attrs.get("end", len(shape))])
    if op in ("Identity", "Cast", "Squeeze", "Unsqueeze"):
        return shape_value(rules, node.inputs[0])
    values = [shape_value(rules, k) for k in node.inputs]
    parts = [p for p in values if p is not None]
    if len(parts) != len(values):
        return None
    if op == "Concat":
        return [d for p in parts for d in p]
    if op == "Gather" and len(parts) == 2 and not any(a.name == "axis" and a.i for a in node.proto.attribute):
        data, indices = parts
        inside = [i for i in indices if isinstance(i, int) and -len(data) <= i < len(data)]
        return [data[i] for i in inside] if len(inside) == len(indices) else None
    if op == "Slice" and len(parts) in (3, 4, 5):  # a 1-D tensor: one axis, 0
        defaults: list[list[Dim | tuple[Dim, ...]]] = [[0], [1]]  # axes, steps
        bounds = [*parts[1:], *defaults[len(parts) - 3:]]
        ints = [b[0] for b in bounds if len(b) == 1 and isinstance(b[0], int)]
        if len(ints) == len(bounds) and ints[2] in (0, -1) and ints[3]:
            start, end, _, step = ints
            return parts[0][start:end:step]
        return None
    if op in ("Add", "Sub", "Mul") and len(parts) == 2:
        left, right = (p * len(parts[1 - i]) if len(p) == 1 else p for i, p in enumerate(parts))
        if len(left) != len(right):
            return None
        if op == "Mul":
            return [multiplied(a, b) for a, b in zip(left, right)]
        if op == "Sub":  # only constants are subtracted: a name's negative is no dimension
            constants = [d for d in right if isinstance(d, int)]
            if len(constants) != len(right):
                return None
            right = [-d for d in constants]
        return [summed([a, b]) for a, b in zip(left, right)]
    return None


def constant_ints(rules: Solver, node: Node, position: int, attribute: str = "",
          default: Sequence[int] | None = None) -> Sequence[int] | np.ndarray | None:
    """The constant ints of input ``position`` or, in opsets before it was an input, of
    ``attribute``; ``default`` when the node has neither; None when they are not constant."""
    if position < len(node.inputs) and node.inputs[position] is not None:
        return rules.constant(node.inputs[position])
    found = next((a for a in node.proto.attribute if a.name == attribute), None)
    return list(found.ints) if found is not None else default
