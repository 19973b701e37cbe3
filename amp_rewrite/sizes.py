"""Element counts of values, for the cost of a cast; shapes are inferred only when asked for."""

from __future__ import annotations

import math
from collections.abc import Iterator

import onnx
from onnx import AttributeProto

from .graph import ModelIndex, Value, set_type

SYMBOLIC_DIM = 64
"""Assumed extent of a dimension with no known value (a batch or sequence length)."""
UNKNOWN_ELEMENTS = 4096
"""Assumed element count of a tensor whose shape shape-inference cannot find."""


class ValueSizes:
    """Element counts; runs ONNX shape inference once, the first time a shape is missing."""

    def __init__(self, index: ModelIndex) -> None:
        self.index = index
        self._inferred = False

    def elements(self, value: Value) -> int:
        if value.shape is None and not self._inferred:
            self._infer()
        if value.shape is None:
            return UNKNOWN_ELEMENTS
        return math.prod(d if isinstance(d, int) and d > 0 else (1 if d == 0 else SYMBOLIC_DIM)
                         for d in value.shape)

    def _infer(self) -> None:
        self._inferred = True
        try:
            inferred = onnx.shape_inference.infer_shapes(self.index.model, data_prop=True)
        except Exception:  # shape inference is a best effort: a custom op or a bad model stops it
            return
        for graph, proto in zip(self.index.graphs, iter_graphs(inferred.graph)):
            for info in (*proto.value_info, *proto.output):
                key = graph.scope.get(info.name)
                value = self.index.values.get(key) if key else None
                if value is not None and value.shape is None:
                    elem_type = value.elem_type
                    set_type(value, info.type)
                    value.elem_type = elem_type or value.elem_type


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A graph and its subgraphs, in the order ``ModelIndex`` numbers them."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from iter_graphs(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_graphs(sub)
