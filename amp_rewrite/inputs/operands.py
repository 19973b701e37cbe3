"""Values for generated inputs that steer an op rather than carry its data.

A Reshape's target, a Resize's scales, a Slice's bounds or a Split's sizes fed by a graph
input almost never fit the data when drawn at random, and the model does not run. Such an
input gets instead the value that leaves its op as close to an identity as the op allows
(the data's own shape as a Reshape target, scales of 1, a Slice of everything, equal parts),
made from what is known of the op's data input: its shape, concrete where the data is a
graph input of the plan, else as the model declares it.

``OPERANDS`` maps (op type, input slot) to the rule; a rule returns None where what it needs
is not known, and the input is drawn at random as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from onnx import helper

from amp_rewrite.ir.graph import ModelIndex, Node

Shape = tuple[int, ...]
Rule = Callable[[Node, "Shape | None", "int | None"], "Sequence[float] | float | None"]
"""(the node, its data input's concrete shape or None, the operand's length, None for a
scalar) -> the operand's values, or None."""

END = np.iinfo(np.int64).max
"""A Slice end past every extent (clamped to the extent)."""
CLASSES = 4
"""A OneHot's depth and a Range's limit: as many as generated indices reach (``samples.INTEGER_HIGH``)."""


def _attribute(node: Node, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in node.proto.attribute if a.name == name), default)


def _filled(value: float) -> Rule:
    """``value`` in every element (a scalar for a scalar operand)."""
    return lambda node, data, length: value if length is None else [value] * length


def _axes(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """The first ``length`` axes (where the data has as many)."""
    if length is None or (data is not None and length > len(data)):
        return None
    return list(range(length))


def _unsqueeze_axes(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    return None if length is None else list(range(length))


def _reshape(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """The data's shape, its trailing axes folded into a -1 or 1s added to reach ``length``."""
    if data is None or length is None:
        return None
    if length >= len(data):
        return [*data, *[1] * (length - len(data))]
    if length == 0 or 0 in data:  # a -1 beside a zero extent is ambiguous
        return None
    return [*data[:length - 1], -1]


def _at_axes(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """The data's extents at the op's ``axes`` (all of them by default): a Resize's sizes, a
    CenterCropPad's shape that change nothing."""
    if data is None:
        return None
    picked = [data[a] for a in _attribute(node, "axes", range(len(data)))]
    return picked if length == len(picked) else None


def _roi(node: Node, data: Shape | None, length: int | None) -> list[float] | None:
    """A region of interest of the whole input: starts 0, ends 1."""
    return None if length is None or length % 2 else [0.0] * (length // 2) + [1.0] * (length // 2)


def _split(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """Equal parts (the last taking what is left) of the split axis, one per output."""
    parts = len(node.outputs)
    if data is None or length != parts or not data:
        return None
    extent = data[_attribute(node, "axis", 0) % len(data)]
    return [extent // parts] * (parts - 1) + [extent - extent // parts * (parts - 1)]


def _squeeze_axes(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """The data's axes of extent 1, where there are ``length`` of them."""
    ones = [] if data is None else [axis for axis, extent in enumerate(data) if extent == 1]
    return ones if data is not None and length == len(ones) else None


def _sequence_lengths(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """Every sequence at the input's full length (time is axis 0, or 1 with ``layout`` 1)."""
    if data is None or length is None or len(data) < 2:
        return None
    return [data[_attribute(node, "layout", 0)]] * length


def _grid_size(node: Node, data: Shape | None, length: int | None) -> list[int] | None:
    """An AffineGrid's size: theta's batch, one channel, extents of 2."""
    return None if data is None or length is None or length < 3 else [data[0], 1, *[2] * (length - 2)]


_RECURRENT = {(op, 4): _sequence_lengths for op in ("LSTM", "GRU", "RNN")}
_REDUCTIONS = {(op, 1): _axes for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                          "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                                          "ReduceSumSquare")}

OPERANDS: Mapping[tuple[str, int], Rule] = {
    ("Reshape", 1): _reshape,
    ("Expand", 1): _filled(1),
    ("Tile", 1): _filled(1),
    ("ConstantOfShape", 0): _filled(1),
    ("Slice", 1): _filled(0), ("Slice", 2): _filled(END), ("Slice", 3): _axes, ("Slice", 4): _filled(1),
    ("Split", 1): _split,
    ("Squeeze", 1): _squeeze_axes,
    ("Unsqueeze", 1): _unsqueeze_axes,
    ("Pad", 1): _filled(0), ("Pad", 2): _filled(0), ("Pad", 3): _axes,
    ("Resize", 1): _roi, ("Resize", 2): _filled(1.0), ("Resize", 3): _at_axes,
    ("Upsample", 1): _filled(1.0),
    ("CenterCropPad", 1): _at_axes,
    ("TopK", 1): _filled(1),
    ("OneHot", 1): _filled(CLASSES),
    ("Range", 0): _filled(0), ("Range", 1): _filled(CLASSES), ("Range", 2): _filled(1),
    ("Dropout", 1): _filled(0.5),  # the op's default ratio
    ("CumSum", 1): _filled(0),
    ("Trilu", 1): _filled(0),
    ("AffineGrid", 1): _grid_size,
    **_RECURRENT,
    **_REDUCTIONS,
}


def operand_values(index: ModelIndex, plan: Mapping[str, Shape],
                   dtypes: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """For graph inputs of ``plan`` (their concrete shapes) that an op of ``OPERANDS`` reads as
    a steering operand, rank 0 or 1: their values (the first such reader's)."""
    values: dict[str, np.ndarray] = {}
    for name, shape in plan.items():
        value = index.values.get((0, name))
        if value is None or len(shape) > 1:
            continue
        for node_id, slot in value.uses:
            node = index.nodes[node_id]
            rule = OPERANDS.get((node.op_type, slot)) if node.domain == "" else None
            made = None if rule is None else rule(node, _data_shape(index, node, plan), shape[0] if shape else None)
            if made is not None:
                values[name] = _typed(np.asarray(made), dtypes[name])
                break
    return values


def _typed(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as ``dtype``, clipped into an integer type's range (END as an int32 stays past every extent)."""
    if dtype.kind in "iu" and array.dtype.kind in "iu":
        limits = np.iinfo(dtype)
        array = np.clip(array, limits.min, limits.max)
    return array.astype(dtype)


def _data_shape(index: ModelIndex, node: Node, plan: Mapping[str, Shape]) -> Shape | None:
    """The concrete shape of the node's first input: as planned for a graph input, else as declared."""
    key = node.inputs[0] if node.inputs else None
    if key is None:
        return None
    if key[0] == 0 and key[1] in plan:
        return plan[key[1]]
    declared: Sequence | None = index.values[key].shape
    return tuple(declared) if declared is not None and all(isinstance(d, int) for d in declared) else None
