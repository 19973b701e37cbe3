"""Models derived for measuring: a model's values exposed as outputs.

``expose`` derives a model whose outputs include the values asked for: a
top-level value becomes a graph output as it is; a value inside an If, Loop or
Scan body is reduced in the body to a statistics vector
``[max |x|, nonzero elements, elements below each of two thresholds]`` that is carried out
through each enclosing control-flow node: out of a Loop as a loop-carried running row (its
size does not grow with the iterations, which a model may make trillions), out of a Scan as
a scan output (one row per element of data present), out of an If as an output with an empty
stand-in in the other branch. One run of that model
measures every value of the model, nested ones included; ``measure`` and ``merge`` read
the runs' results into statistics per value. Nothing here runs ONNX Runtime
(``instrument`` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.defs
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from amp_rewrite.ir.builder import GraphBuilder, Names
from amp_rewrite.ir.graph import ModelIndex, ValueKey
from amp_rewrite.ir.measurements import Thresholds, ValueStats
from amp_rewrite.ir.sizes import has_subgraphs, iter_graphs
from amp_rewrite.ir.types import typed_index

STAT_PREFIX = "__amp_stat"
# Where a control-flow node carries a body output out: the attribute names of its
# bodies, and for Scan the per-scan-output attributes that must grow with it.
_LIFTABLE = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}
_SCAN_OUTPUT_ATTRIBUTES = ("scan_output_axes", "scan_output_directions")


@dataclass
class Exposed:
    """A model with extra outputs, and what each extra output holds."""

    model: onnx.ModelProto
    top: list[str]
    """Top-level values that are graph outputs as they are."""
    stats: dict[str, ValueKey]
    """Statistics outputs: output name -> nested value."""


def float_values(model: onnx.ModelProto, top_level: bool = False) -> list[ValueKey]:
    """Keys of the float32 values that nodes compute (every graph, or the top level only)."""
    return [key for key in _computed_floats(typed_index(model)) if key[0] == 0 or not top_level]


def _computed_floats(index: ModelIndex) -> list[ValueKey]:
    return [v.key for v in index.all_values() if v.producer is not None and v.elem_type == TensorProto.FLOAT]


def expose(model: onnx.ModelProto, keys: Iterable[ValueKey], thresholds: Thresholds | None = None) -> Exposed:
    """A copy of ``model`` whose outputs also give each value of ``keys``: a top-level one as it
    is (of any type), a nested one (a float value) as its statistics row (which ``thresholds``
    define)."""
    keys = list(keys)
    if thresholds is None and any(key[0] != 0 for key in keys):
        raise ValueError("nested values are exposed as statistics rows, which need thresholds")
    exposed = lift_nested(model, keys, thresholds, copy=True)
    present = {o.name for o in exposed.model.graph.output}
    for _, name in (k for k in keys if k[0] == 0):
        if name not in present:
            exposed.model.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
        exposed.top.append(name)
    return exposed


def lift_nested(model: onnx.ModelProto, keys: Iterable[ValueKey] | None, thresholds: Thresholds | None,
                copy: bool = False) -> Exposed:
    """``model`` (a copy when ``copy`` or when a value is lifted) in which every nested value of
    ``keys`` (None: every nested float32 value that a node computes) is reduced to a statistics
    row carried to a top-level output (``stats``); ``thresholds`` may be None only where there is none."""
    nested = None if keys is None else [k for k in keys if k[0] != 0]
    if nested is None and not has_subgraphs(model.graph):
        nested = []
    if nested is None or nested or copy:
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
        model = model_copy
    stats: dict[str, ValueKey] = {}
    if nested is None or nested:
        index = typed_index(model)
        if nested is None:
            nested = [key for key in _computed_floats(index) if key[0] != 0]
        builder = _StatBuilder(index, thresholds)
        for key in nested:
            name = builder.lift(key) if key in index.values else None
            if name is not None:
                stats[name] = key
        builder.finish()
    return Exposed(model, [], stats)


def exact_sigmoid(model: onnx.ModelProto) -> None:
    """Compute each Sigmoid of ``model`` (every graph, in place) as exp(-softplus(-x)), which
    ONNX Runtime's CPU kernels give to within 5.3e-7 relative from -100 to 40: its Sigmoid is
    exact only to 2^-25 absolute (multiples of 3e-8: 3e-8 at -17.9999, 0 at -18 and at -57), so
    a measurement through it sees zeros where float32 holds values that float16 flushes to zero
    (and a Log after them turns -inf on a GPU). The composition is of unary ops: any float type."""
    def sigmoid(node: onnx.NodeProto) -> bool:
        return node.op_type == "Sigmoid" and node.domain in ("", "ai.onnx")

    names: Names | None = None
    for graph in iter_graphs(model.graph):  # a graph rebuilt here is walked on as rebuilt
        if not any(map(sigmoid, graph.node)):
            continue
        names = names or Names.of_model(model)
        nodes = []
        for node in graph.node:
            if not sigmoid(node):
                nodes.append(node)
                continue
            made = [names.fresh(f"{node.output[0]}_exact_sigmoid") for _ in range(3)]
            nodes += [helper.make_node(op, [source], [target], name=names.fresh(f"{target}_node"))
                      for op, source, target in zip(("Neg", "Softplus", "Neg", "Exp"), [node.input[0], *made],
                                                    [*made, node.output[0]])]
        graph.ClearField("node")
        graph.node.extend(nodes)


class _StatBuilder:
    """Makes the statistics nodes: one ``GraphBuilder`` per graph (model-wide names, constants
    cached per graph), whose nodes are appended to their graph by ``finish``."""

    def __init__(self, index: ModelIndex, thresholds: Thresholds | None) -> None:
        self.index = index
        self.thresholds = thresholds
        self.owner = {g: node_id for node_id, graphs in index.subgraphs.items() for g in graphs}
        self.root = GraphBuilder(Names.of_model(index.model), index.opsets.get("", onnx.defs.onnx_opset_version()),
                                 prefix=STAT_PREFIX + "_")
        self.builders: dict[int, GraphBuilder] = {}

    def lift(self, key: ValueKey) -> str | None:
        """Reduce a nested value to its statistics and carry them to a top-level output."""
        graph_id, name = key
        if not self._liftable(graph_id):
            return None
        stat = self._stat_nodes(self._builder(graph_id), name)
        while graph_id != 0:
            stat, graph_id = self._carry_out(graph_id, stat)
        self.index.model.graph.output.append(helper.make_tensor_value_info(stat, TensorProto.FLOAT, None))
        return stat

    def finish(self) -> None:
        """Append each graph's new nodes to it (they read only values defined before them)."""
        for graph_id, builder in self.builders.items():
            self.index.graphs[graph_id].proto.node.extend(builder.nodes)

    def _builder(self, graph_id: int) -> GraphBuilder:
        if graph_id not in self.builders:
            self.builders[graph_id] = self.root.child()
        return self.builders[graph_id]

    def _liftable(self, graph_id: int) -> bool:
        while graph_id != 0:
            owner = self.index.nodes[self.owner[graph_id]]
            if owner.domain != "" or owner.op_type not in _LIFTABLE:
                return False
            graph_id = owner.graph
        return True

    def _stat_nodes(self, b: GraphBuilder, value: str) -> str:
        """Nodes computing [max |x| over the finite elements (from opset 9, which has Where), nonzero
        count, count below each threshold] (shape [4])."""
        zero = b.const(np.zeros(1, np.float32))
        flat = b.op("Reshape", b.op("Abs", value), b.ints([-1]))
        if b.opset >= 9:
            flat = b.op("Where", b.op("Less", flat, b.const(np.array([np.inf], np.float32))), flat, zero)
        padded = b.op("Concat", flat, zero, axis=0)
        peak = b.op("ReduceMax", padded, keepdims=1)
        nonzero = b.op("Cast", b.op("Greater", padded, zero), to=TensorProto.FLOAT)
        counts = [b.op("ReduceSum", nonzero, keepdims=1)]
        assert self.thresholds is not None, "a nested value's statistics need thresholds"
        for threshold in (self.thresholds.flush, self.thresholds.normal):
            below = b.op("Cast", b.op("Less", padded, b.const(np.array([threshold], np.float32))),
                         to=TensorProto.FLOAT)
            counts.append(b.op("ReduceSum", b.op("Mul", nonzero, below), keepdims=1))
        return b.op("Concat", peak, *counts, axis=0)

    def _carry_out(self, graph_id: int, name: str) -> tuple[str, int]:
        """Make ``name`` an output of its body and of the owning node; return the node's new output."""
        owner = self.index.nodes[self.owner[graph_id]]
        if owner.op_type == "Loop":
            return self._accumulate(owner.proto, graph_id, name), owner.graph
        bodies = [a for a in owner.proto.attribute if a.type == AttributeProto.GRAPH]
        for attr, body_id in zip(bodies, self.index.subgraphs[owner.id]):
            body = attr.g
            if body_id == graph_id:
                body.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            else:  # the other If branch gives an empty stand-in (one per output: outputs are distinct values)
                stand_in = self._builder(body_id).op("Constant", value=numpy_helper.from_array(np.zeros(0, np.float32)))
                body.output.append(helper.make_tensor_value_info(stand_in, TensorProto.FLOAT, None))
        if owner.op_type == "Scan":
            for attr in owner.proto.attribute:
                if attr.name in _SCAN_OUTPUT_ATTRIBUTES:
                    attr.ints.append(0)
        carried = self.root.names.fresh(STAT_PREFIX + "_carried")
        owner.proto.output.append(carried)
        return carried, owner.graph

    def _accumulate(self, loop: onnx.NodeProto, body_id: int, stat: str) -> str:
        """Carry the rows ``stat`` out of a Loop as a loop-carried row, each iteration's rows merged
        into it (the largest peak, the sums of the counts), starting from zeros (a Constant first in
        the Loop's graph); return the Loop's new output, the row after the last iteration."""
        names, body = self.root.names, self.index.graphs[body_id].proto
        carried = len(loop.input) - 2  # after the trip count and the condition
        before = names.fresh(STAT_PREFIX + "_running")
        b = self._builder(body_id)
        rows = b.op("Concat", b.op("Reshape", before, b.ints([1, 4])), b.op("Reshape", stat, b.ints([-1, 4])), axis=0)
        peak = b.op("Gather", b.axes_op("ReduceMax", rows, [0], keepdims=0), b.ints([0]), axis=0)
        counts = b.op("Gather", b.reduce_sum(rows, [0], keepdims=0), b.ints([1, 2, 3]), axis=0)
        after = b.op("Concat", peak, counts, axis=0)
        body.input.append(helper.make_tensor_value_info(before, TensorProto.FLOAT, [4]))
        body.output.insert(1 + carried, helper.make_tensor_value_info(after, TensorProto.FLOAT, [4]))
        start = names.fresh(STAT_PREFIX + "_start")
        self.index.graphs[self.index.nodes[self.owner[body_id]].graph].proto.node.insert(
            0, helper.make_node("Constant", [], [start], name=names.fresh(start + "_node"),
                                value=numpy_helper.from_array(np.zeros(4, np.float32))))
        loop.input.append(start)
        final = names.fresh(STAT_PREFIX + "_carried")
        loop.output.insert(carried, final)
        return final


def measure(exposed: Exposed, results: Mapping[str, np.ndarray],
            thresholds: Thresholds) -> dict[ValueKey, ValueStats]:
    """Statistics of every exposed value from one run's results."""
    measured = {(0, name): ValueStats.of(results[name], thresholds) for name in exposed.top}
    for name, key in exposed.stats.items():
        measured[key] = ValueStats.of_rows(results[name])
    return measured


def merge(runs: Iterable[dict[ValueKey, ValueStats]]) -> dict[ValueKey, ValueStats]:
    merged: dict[ValueKey, ValueStats] = {}
    for measured in runs:
        for key, stats in measured.items():
            merged[key] = merged[key].merged(stats) if key in merged else stats
    return merged
