"""One graph builder for every module that makes nodes (after onnx-ir's ``Tape``).

``op`` appends a node and returns its output name; names are unique across the
model (a ``Names`` registry is shared by the builders of its graphs); constants
are cached per builder; every value's element type is tracked (from the
arguments, or implied by the op's schema), so a constant can be made "like" an
operand and a rule never names an element type. The builder collects nodes;
the caller decides where they go (appended to a graph, or placed with
``PendingInserts``). Opset-dependent forms (axes as an attribute or an input)
are chosen here, once, from the default-domain opset the builder targets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.types import output_types, value_types

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
LOW_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
"""The float types narrower than float32, whose sums are taken in float32."""

# Opset from which each op takes its axes as an input rather than an attribute.
_AXES_AS_INPUT = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "ReduceMean": 18, "ReduceMax": 18,
                  "ReduceMin": 18, "ReduceProd": 18, "ReduceSumSquare": 18, "ReduceL1": 18, "ReduceL2": 18,
                  "ReduceLogSum": 18, "ReduceLogSumExp": 18}


class Names:
    """The names taken in one model (values and nodes); ``fresh`` returns an unused one."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken = set(taken)
        self._next: dict[str, int] = {}

    @classmethod
    def of_model(cls, model: onnx.ModelProto) -> Names:
        from amp_rewrite.ir.sizes import iter_graphs

        taken: set[str] = set()
        for graph in iter_graphs(model.graph):
            taken.update(i.name for i in graph.input)
            taken.update(t.name for t in graph.initializer)
            for node in graph.node:
                taken.update(node.output)
                taken.add(node.name)
        return cls(taken)

    def fresh(self, base: str) -> str:
        """``base``, or ``base_N`` with the next N not taken (counted per base: O(1) per name)."""
        name, n = base, self._next.get(base, 0)
        if n:
            name = f"{base}_{n}"
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self._next[base] = n + 1
        self.taken.add(name)
        return name


class GraphBuilder:
    """Builds nodes for one graph. ``types`` maps known value names to element types."""

    def __init__(self, names: Names, opset: int, types: Mapping[str, int] | None = None, prefix: str = "") -> None:
        self.names = names
        self.opset = opset
        self.types: dict[str, int] = types if isinstance(types, dict) else dict(types or {})
        """Shared with child builders: names are unique model-wide, so one map serves every graph."""
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.made_by: dict[str, onnx.NodeProto] = {}
        """The node of ``nodes`` that makes each of their outputs."""
        self._constants: dict[tuple, str] = {}

    @classmethod
    def for_index(cls, index: ModelIndex, prefix: str = "", default_opset: int = 17) -> GraphBuilder:
        """A builder for ``index``'s model: its names taken, its values' types known, its
        default-domain opset (``default_opset`` when it imports none)."""
        return cls(Names.of_model(index.model), index.opsets.get("", default_opset), value_types(index), prefix)

    def child(self, prefix: str | None = None) -> GraphBuilder:
        """A builder for a subgraph: same names and known types, its own nodes and constants."""
        return GraphBuilder(self.names, self.opset, self.types, self.prefix if prefix is None else prefix)

    # -- nodes ------------------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str | None, outputs: int | Sequence[str] = 1, domain: str = "",
           name: str | None = None, **attributes) -> str:
        """Append a node; return its output name (its first output's when it has several, see ``ops``)."""
        return self.ops(op_type, *inputs, outputs=outputs, domain=domain, name=name, **attributes)[0]

    def ops(self, op_type: str, *inputs: str | None, outputs: int | Sequence[str] = 1, domain: str = "",
            name: str | None = None, **attributes) -> list[str]:
        """Append a node; return all its output names."""
        base = self.prefix + op_type.lower()
        names = [self.names.fresh(base) for _ in range(outputs)] if isinstance(outputs, int) else list(outputs)
        self.names.taken.update(names)
        attributes = {k: v for k, v in attributes.items() if v is not None}
        node = helper.make_node(op_type, ["" if i is None else i for i in inputs], names,
                                name=name or self.names.fresh(f"{base}_node"), domain=domain or None, **attributes)
        if domain:
            node.domain = domain
        self.nodes.append(node)
        self.made_by.update((out, node) for out in names)
        implied = output_types(node, self.opset, [self.types.get(i) if i else None for i in inputs])
        for out, elem_type in zip(names, implied):
            if elem_type is not None:
                self.types[out] = elem_type
        return names

    # -- constants --------------------------------------------------------------------------------
    def const(self, value, like: str | None = None, elem_type: int | None = None) -> str:
        """A constant holding ``value``, of ``like``'s element type (or ``elem_type``; int64 for ints)."""
        if elem_type is None:
            elem_type = self.types[like] if like is not None else None
        array = np.asarray(value)
        if elem_type is None:
            elem_type = {"b": TensorProto.BOOL, "i": TensorProto.INT64, "u": TensorProto.INT64}.get(
                array.dtype.kind, TensorProto.FLOAT)
        np_type = helper.tensor_dtype_to_np_dtype(elem_type)
        array = array.astype(np_type)
        key = (elem_type, array.shape, array.tobytes())
        cached = self._constants.get(key)
        if cached is not None:
            return cached
        out = self.names.fresh(self.prefix + "const")
        self.nodes.append(helper.make_node("Constant", [], [out], name=self.names.fresh(out + "_node"),
                                           value=numpy_helper.from_array(array, out)))
        self.types[out] = elem_type
        self._constants[key] = out
        return out

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D int64 constant (axes, shapes, pads)."""
        return self.const(np.asarray(list(values), dtype=np.int64))

    def zeros_like(self, x: str) -> str:
        """Zeros of ``x``'s shape and element type."""
        return self.op("ConstantOfShape", self.op("Shape", x),
                       value=numpy_helper.from_array(np.zeros(1, helper.tensor_dtype_to_np_dtype(self.types[x]))))

    def ones(self, shape: str, like: str) -> str:
        """Ones of the (int64 value) ``shape``, of ``like``'s element type."""
        return self.op("ConstantOfShape", shape,
                       value=numpy_helper.from_array(np.ones(1, helper.tensor_dtype_to_np_dtype(self.types[like]))))

    def row_statistics(self, x: str, outputs: int, epsilon: float | None = None) -> list[str]:
        """The Mean (and, ``outputs`` 2, the InvStdDev) of a LayerNormalization of ``x`` over its
        axes from 2 on, with a unit scale: each (n, c)'s statistics, [N, C, 1, ...], accumulated
        and returned in float32 whatever ``x``'s type (``stash_type`` 1)."""
        _, *stats = self.ops("LayerNormalization", x, self.ones(self.op("Shape", x, start=2), x),
                             outputs=1 + outputs, axis=2, epsilon=epsilon, stash_type=1)
        for stat in stats:
            self.types[stat] = TensorProto.FLOAT
        return stats

    # -- opset-dependent forms ----------------------------------------------------------------------
    def axes_op(self, op_type: str, x: str, axes: list[int] | tuple[int, ...] | str | None, **attributes) -> str:
        """A reduction, Squeeze or Unsqueeze with ``axes`` as the opset wants them (a list, or an
        int64 value when the opset takes an input)."""
        if self.opset >= _AXES_AS_INPUT.get(op_type, 10**6):
            axes_input = self.ints(axes) if isinstance(axes, (list, tuple)) else axes
            return self.op(op_type, x, axes_input, **attributes)
        if isinstance(axes, str):
            raise ValueError(f"{op_type} at opset {self.opset} takes constant axes only")
        return self.op(op_type, x, axes=None if axes is None else list(axes), **attributes)

    def reduce_sum(self, x: str, axes: list[int] | tuple[int, ...] | str, keepdims: int = 1) -> str:
        """Sum over ``axes``; an empty axes value sums nothing (it is not "all axes")."""
        if isinstance(axes, (list, tuple)) and not axes:
            return x
        noop = 1 if self.opset >= 13 else None
        return self.axes_op("ReduceSum", x, axes, keepdims=keepdims, noop_with_empty_axes=noop)

    def is_float(self, name: str) -> bool:
        return self.types.get(name) in FLOAT_TYPES
