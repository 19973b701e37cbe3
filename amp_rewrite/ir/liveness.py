"""A graph's planned memory: what it keeps, and the peak of the values it computes, in its order.

Graph inputs and initializers are kept the whole run; every value a node makes is live from that
node to its last reader (a graph output: to the end). The peak of the live set is what an
allocator with perfect reuse needs beside the kept tensors when the nodes run in the graph's
order; a runtime's own order, arena and workspaces come on top, which is what a measurement of
the session shows against it.

Invariant: ``planned`` reads the model only; values whose shape or type is unknown count as
nothing and are counted in ``unknown``.
"""

from __future__ import annotations

import onnx
from onnx import helper

from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.ir.types import typed_index


def planned(model: onnx.ModelProto, top: int) -> dict:
    """Kept bytes, the live set's peak (bytes, the node where it is reached) and its largest
    values, of ``model``'s top-level graph in its order."""
    index = typed_index(model)
    sizes = ValueSizes(index)
    graph = model.graph
    unknown: list[str] = []

    def nbytes(name: str) -> int:
        value = index.values.get((0, name))
        shape = sizes.shape(value) if value is not None else None
        if value is None or not value.elem_type or shape is None or any(not isinstance(d, int) for d in shape):
            unknown.append(name)
            return 0
        return sizes.elements(value) * helper.tensor_dtype_to_np_dtype(value.elem_type).itemsize

    kept = sum(nbytes(i.name) for i in graph.input) + sum(nbytes(t.name) for t in graph.initializer)
    outputs = {o.name for o in graph.output}
    last: dict[str, int] = {}
    for position, node in enumerate(graph.node):
        for name in node.input:
            last[name] = position
    born: dict[str, int] = {}
    for position, node in enumerate(graph.node):
        for name in node.output:
            if name:
                born[name] = position
    size = {name: nbytes(name) for name in born}
    ends = {name: len(graph.node) if name in outputs else last.get(name, position) for name, position in born.items()}
    deaths: dict[int, list[str]] = {}
    for name, end in ends.items():
        deaths.setdefault(end, []).append(name)
    live: set[str] = set()
    current = peak = peak_at = 0
    peak_values: list[str] = []
    for position, node in enumerate(graph.node):
        for name in node.output:
            if name:
                live.add(name)
                current += size[name]
        if current > peak:
            peak, peak_at, peak_values = current, position, sorted(live, key=lambda n: -size[n])[:top]
        for name in deaths.get(position, []):
            live.discard(name)
            current -= size[name]
    node = graph.node[peak_at] if graph.node else None
    return {"kept": kept, "peak": peak, "at": f"{node.op_type} {node.name}" if node else "",
            "largest": [(name, size[name]) for name in peak_values], "nodes": len(graph.node),
            "unknown": len(set(unknown))}
