"""Extents that a graph implies for its inputs' symbolic dimensions.

Generated inputs give a named dimension one extent everywhere (``batch`` = 8), which breaks a
model that reshapes ``batch x 16`` to a fixed [1, 4, 64]: the graph says ``batch`` is 4.
``implied_dims`` reads such bindings off the graph. ONNX shape inference, run on a copy
without the model's own value_info (an unnamed input dimension named ``input[axis]`` there),
carries the inputs' dimension names through elementwise ops, MatMul and their like, in every
graph (If and Loop bodies included); then, until nothing new is learnt:

- Reshape to a constant shape without -1: the element counts agree, which gives the one
  input dimension left unknown (with -1, the count is a multiple of the fixed extents);
- a fixed extent that the model's value_info or outputs declare where inference has a name;
- broadcasting (elementwise ops, Expand, MatMul's batch dimensions) against one fixed extent
  above 1 (a Tile or Expand of a constant reaches here through its inferred shape), and
  dimensions that must be equal (Concat's off its axis, MatMul's contracted one).

Each binding names the node or value that implied it; the first one found wins. When names
are still unbound after that, the rules run again guessing: a count that several names share
goes to the last of them, the others 1 (marked "guessed").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import defs, numpy_helper

from amp_rewrite.ir.graph import ModelIndex, Node, ValueKey
from amp_rewrite.ir.sizes import iter_graphs, without_weights
from amp_rewrite.ir.tensors import constant_tensor

Dim = int | str | None
"""A fixed extent, a dimension's name, or None where nothing is known."""
MAX_ROUNDS = 4
"""Rounds of the rules over the graph; a binding found late can enable another."""
BROADCASTING = frozenset(s.name for s in defs.get_all_schemas()
                         if s.domain == "" and "multidirectional" in (s.doc or "").lower())
"""Ops whose inputs broadcast numpy-style, as their ONNX schemas say (Add, Mul, Where, ...)."""


@dataclass(frozen=True)
class Pin:
    """An extent for a dimension name, and what implied it."""

    extent: int
    origin: str


def unnamed_dim(input_name: str, axis: int) -> str:
    """The name an input's unnamed dimension goes by in bindings."""
    return f"{input_name}[{axis}]"


def implied_dims(model: onnx.ModelProto, shapes: Mapping[str, Sequence[Dim]],
                 given: Mapping[str, Pin] | None = None) -> dict[str, Pin]:
    """Bindings of the dimension names in ``shapes`` (the model's inputs, each dimension fixed
    or named) that the graph implies, starting from ``given``, which wins over them."""
    pins = dict(given or {})
    names = {d for dims in shapes.values() for d in dims if isinstance(d, str)}
    if not names - set(pins):
        return pins
    try:
        inferred = onnx.shape_inference.infer_shapes(_undeclared(model, shapes), data_prop=True)
    except Exception:  # shape inference is a best effort: a custom op or a bad model stops it
        return pins
    rules = _Rules(ModelIndex(inferred), names, pins)
    declared = _declared(model, rules.index)
    _apply(rules, declared)
    if names - set(pins):  # then guess: a count shared by several names goes to the last of them
        rules.guessing = True
        _apply(rules, declared)
    return pins


def _apply(rules: _Rules, declared: list[tuple[ValueKey, tuple]]) -> None:
    """The rules, in rounds until a round binds nothing new."""
    for _ in range(MAX_ROUNDS):
        found = len(rules.pins)
        for node in rules.index.nodes:
            rule = _NODE_RULES.get(node.op_type) or (_broadcast if node.op_type in BROADCASTING else None)
            if rule is not None and node.domain == "":
                rule(rules, node)
        for key, dims in declared:
            inferred = rules.shape(key)
            if inferred is not None and len(inferred) == len(dims):
                rules.agree(zip(inferred, dims), f"the declared shape of {key[1]!r}")
        if len(rules.pins) == found:
            break


class _Rules:
    """What the rules share: the inferred shapes, constants, and the bindings found so far."""

    def __init__(self, index: ModelIndex, names: set[str], pins: dict[str, Pin]) -> None:
        self.index, self.names, self.pins = index, names, pins
        self.guessing = False
        """Whether ``same_count`` may split a count among several names (the others get 1)."""

    def shape(self, key: ValueKey | None) -> tuple | None:
        """The inferred shape; for a Loop's carried value that inference left without one (its
        shape could change between iterations), the shape of its initial value."""
        if key is None:
            return None
        value = self.index.values[key]
        producer = self.index.producer_node(value)
        if value.shape is None and producer is not None and producer.op_type == "Loop" and producer.domain == "":
            carried = value.producer[1] + 2
            if carried < len(producer.inputs):
                return self.shape(producer.inputs[carried])
        return value.shape

    def constant(self, key: ValueKey | None) -> np.ndarray | None:
        """The value of a constant int tensor (a small initializer or a Constant node's), or None."""
        if key is None:
            return None
        tensor = self.index.initializers.get(key)
        producer = self.index.producer_node(self.index.values[key])
        if tensor is None and producer is not None and producer.op_type == "Constant":
            tensor = constant_tensor(producer.proto)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        array = numpy_helper.to_array(tensor)
        return array.astype(np.int64).reshape(-1) if array.dtype.kind in "iu" else None

    def extent(self, dim: Dim) -> Dim:
        pin = self.pins.get(dim) if isinstance(dim, str) else None
        return pin.extent if pin else dim

    def pin(self, name: str, extent: int, origin: str) -> None:
        if name in self.names and name not in self.pins and extent >= 1:
            self.pins[name] = Pin(extent, origin)

    def agree(self, columns: Iterable[Sequence[Dim]], origin: str, broadcast: bool = False) -> None:
        """Each column holds dimensions that must be equal (``broadcast``: or 1): one fixed
        extent among them (above 1 when broadcasting) binds the names there."""
        for column in columns:
            extents = [self.extent(d) for d in column]
            fixed = {d for d in extents if isinstance(d, int) and (d > 1 or not broadcast)}
            if len(fixed) == 1:
                for d in extents:
                    if isinstance(d, str):
                        self.pin(d, next(iter(fixed)), origin)

    def multiple_of(self, dims: Sequence[Dim], factors: Sequence[Dim], origin: str) -> None:
        """When guessing: ``dims`` must hold a multiple of the fixed ``factors``' product; the
        last name of ``dims`` not yet bound makes up what the fixed extents lack (others 1)."""
        extents = [self.extent(d) for d in dims]
        factors = [self.extent(f) for f in factors]
        if not self.guessing or None in extents or not all(isinstance(f, int) for f in factors):
            return
        needed = math.prod(factors)
        have = math.prod(e for e in extents if isinstance(e, int))
        unknown = [e for e in extents if isinstance(e, str)]
        if unknown and needed > 0 and have > 0 and have % needed:
            self.split(unknown, needed // math.gcd(needed, have), origin, last_guessed=True)

    def split(self, names: Sequence[str], extent: int, origin: str, last_guessed: bool = False) -> None:
        """``extent`` for the last of ``names`` (a guess too if ``last_guessed``), 1 (guessed) for
        the others."""
        for name in names[:-1]:
            self.pin(name, 1, f"{origin}, guessed")
        self.pin(names[-1], extent, f"{origin}, guessed" if last_guessed else origin)

    def same_count(self, left: Sequence[Dim], right: Sequence[Dim], origin: str) -> None:
        """``left`` and ``right`` hold as many elements: solve for the one name left unknown."""
        fixed, named = [1, 1], [Counter(), Counter()]
        for side, dims in enumerate((left, right)):
            for dim in map(self.extent, dims):
                if dim is None:
                    return
                if isinstance(dim, int):
                    fixed[side] *= dim
                else:
                    named[side][dim] += 1
        common = named[0] & named[1]
        unknown = [(side, name, n) for side in (0, 1) for name, n in (named[side] - common).items()]
        sides = {side for side, _, _ in unknown}
        if not unknown or len(sides) != 1 or any(n != 1 for _, _, n in unknown) or 0 in fixed:
            return
        if len(unknown) > 1 and not self.guessing:
            return
        side = sides.pop()
        if fixed[1 - side] % fixed[side] == 0:
            self.split([name for _, name, _ in unknown], fixed[1 - side] // fixed[side], origin)


def _reshape(rules: _Rules, node: Node) -> None:
    data, target = rules.shape(node.inputs[0]), rules.constant(node.inputs[1] if len(node.inputs) > 1 else None)
    if data is None or target is None:
        return
    allowzero = any(a.name == "allowzero" and a.i for a in node.proto.attribute)
    if not allowzero and any(t == 0 and i >= len(data) for i, t in enumerate(target)):
        return
    result = [data[i] if t == 0 and not allowzero else int(t) for i, t in enumerate(target)]
    if (target < 0).any():  # a -1 takes what is left: the count need only be a multiple of the rest
        rules.multiple_of(data, [d for d, t in zip(result, target) if t >= 0], f"Reshape {node.label!r}")
    else:
        rules.same_count(data, result, f"Reshape {node.label!r}")


def _broadcast(rules: _Rules, node: Node) -> None:
    shapes = [rules.shape(key) for key in node.inputs if key is not None]
    if node.op_type == "Expand":
        shapes[1:] = [_as_dims(rules.constant(node.inputs[1]))]
    if all(s is not None for s in shapes):
        rules.agree(_aligned(shapes), f"{node.op_type} {node.label!r}", broadcast=True)


def _concat(rules: _Rules, node: Node) -> None:
    shapes = [rules.shape(key) for key in node.inputs if key is not None]
    if not shapes or any(s is None or len(s) != len(shapes[0]) for s in shapes):
        return
    axis = next((a.i for a in node.proto.attribute if a.name == "axis"), 0) % max(len(shapes[0]), 1)
    rules.agree((column for i, column in enumerate(zip(*shapes)) if i != axis), f"Concat {node.label!r}")


def _matmul(rules: _Rules, node: Node) -> None:
    a, b = (rules.shape(key) for key in node.inputs[:2])
    if not a or not b:
        return
    origin = f"MatMul {node.label!r}"
    rules.agree([(a[-1], b[-2] if len(b) > 1 else b[0])], origin)
    rules.agree(_aligned([a[:-2], b[:-2]]), origin, broadcast=True)


def _aligned(shapes: Sequence[Sequence[Dim] | None]) -> list[list[Dim]]:
    """Columns of right-aligned shapes (numpy broadcasting), each with the dims that reach it."""
    rank = max((len(s) for s in shapes if s is not None), default=0)
    return [[s[len(s) - rank + i] for s in shapes if s is not None and len(s) - rank + i >= 0]
            for i in range(rank)]


def _as_dims(array: np.ndarray | None) -> list[Dim] | None:
    return None if array is None else [int(v) for v in array]


_NODE_RULES: dict[str, Callable[[_Rules, Node], None]] = {
    "Reshape": _reshape, "Expand": _broadcast, "Concat": _concat, "MatMul": _matmul}


def _undeclared(model: onnx.ModelProto, shapes: Mapping[str, Sequence[Dim]]) -> onnx.ModelProto:
    """A copy without weights' bytes and with no declared shape but the inputs', whose
    unnamed dimensions get their binding names: what inference concludes from the inputs alone."""
    light = without_weights(model)
    for graph in iter_graphs(light.graph):
        del graph.value_info[:]
        for info in graph.output:
            info.type.tensor_type.ClearField("shape")
    for info in light.graph.input:
        for dim, named in zip(info.type.tensor_type.shape.dim, shapes.get(info.name, ())):
            if isinstance(named, str):
                dim.dim_param = named
    return light


def _declared(model: onnx.ModelProto, index: ModelIndex) -> list[tuple[ValueKey, tuple]]:
    """(key, dims) of the shapes the model declares for values that nodes compute, in any graph."""
    declared = []
    for graph, proto in zip(index.graphs, iter_graphs(model.graph)):
        for info in (*proto.value_info, *proto.output):
            key = graph.scope.get(info.name)
            tensor_type = info.type.tensor_type
            if key is not None and index.values[key].producer is not None and tensor_type.HasField("shape"):
                declared.append((key, tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                                            for d in tensor_type.shape.dim)))
    return declared

