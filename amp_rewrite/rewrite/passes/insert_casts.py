"""InsertCasts: the one pass that edits the model, turning a coloring into types and casts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from amp_rewrite.ir.builder import GraphBuilder, Names
from amp_rewrite.ir.graph import INITIALIZER, Node, PendingInserts, Value, ValueKey
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.tensors import SOURCE_TYPE_KEY, constant_tensor, convert_embedded, read_array
from amp_rewrite.policy.oplists import RETYPED_BY_ATTRIBUTE
from amp_rewrite.rewrite.analysis import FLOAT, OFFLINE, Analysis
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.passes.base import Pass, PassResult


@dataclass
class RewriteStats:
    """What the passes that edit the model did, for the report and for ``io.save``."""

    casts: int = 0
    initializers_converted: int = 0
    initializer_copies: int = 0
    constants_converted: int = 0
    deferred: dict[str, Precision] = field(default_factory=dict)
    """Top-level initializers still float32 in memory, to be converted as they are saved
    (``InsertCasts(defer=True)``; pass them to ``io.save``)."""
    retyped: dict[ValueKey, int] = field(default_factory=dict)
    """The element type of each value whose type the rewrite changed."""

    @property
    def edits(self) -> int:
        """How many edits these count: casts, retyped values, converted constants."""
        return self.casts + len(self.retyped) + self.initializers_converted + self.constants_converted


@dataclass
class Rewrite:
    """The context of the passes that edit the model (``InsertCasts`` and those after it): the
    analysis whose coloring they apply, its index over the model they edit, and what they did."""

    analysis: Analysis
    stats: RewriteStats = field(default_factory=RewriteStats)


class InsertCasts(Pass[Rewrite]):
    """Invariant: every float32 value read in another precision than it is produced in
    goes through exactly one Cast per target type, placed in the value's defining graph
    right after its producer (so readers in subgraphs see it too), never as a chain of
    casts; constants are converted once, offline, with a copy per precision only when
    both are read; low nodes with attribute-typed outputs are retyped; graph outputs keep
    their names and declared types; value_info entries agree with the new types.

    ``defer``: leave the data of embedded top-level initializers float32 and list them in
    ``RewriteStats.deferred``, for ``io.save`` to convert one at a time as it writes them
    (the model is complete only once saved so).
    """

    def __init__(self, defer: bool = False) -> None:
        self.defer = defer

    def run(self, rewrite: Rewrite) -> PassResult:
        """Apply the coloring; what it did goes to ``rewrite.stats``."""
        self.analysis = analysis = rewrite.analysis
        self.low = analysis.precision.onnx_type
        self.stats = stats = rewrite.stats
        before = stats.edits
        self.edits = PendingInserts()
        index = analysis.index
        # Every name the index knows, undefined outer references included (``Names.of_model`` misses those).
        self.names = Names({name for _, name in index.values} | {n.proto.name for n in index.nodes})
        self.builder = GraphBuilder(self.names, index.opsets.get("", _newest_opset(index.model)))
        self.infos = _value_infos(analysis)
        for value in [v for v in index.all_values() if analysis.is_float(v)]:
            self._rewrite_value(value)
        for node_id, decision in analysis.coloring.decisions.items():
            if decision.color is Color.LOW:
                _retype_attribute(analysis.index.nodes[node_id], self.low, analysis)
        self.edits.apply(analysis.index)
        if self.stats.casts and "" not in analysis.index.opsets:
            analysis.index.model.opset_import.add(domain="", version=self.builder.opset)
        return PassResult(stats.edits != before)

    # -- per value ---------------------------------------------------------------------------
    def _needs(self, value: Value) -> dict[Color, list[tuple[int, int]]]:
        needs: dict[Color, list[tuple[int, int]]] = defaultdict(list)
        produced = self.analysis.producer_color(value)
        for use in value.uses:
            needs[self._reads_in(*use, produced)].append(use)
        return needs

    def _reads_in(self, node_id: int, i: int, produced: Color | str) -> Color:
        """The precision a reader takes a value in: its use's color, or the value's own where
        the reader converts on its own (``Analysis.reads_as_made``)."""
        color = self.analysis.use_color(node_id, i)
        if color is not produced and isinstance(produced, Color) and self.analysis.reads_as_made(node_id, i):
            return produced
        return color

    def _rewrite_value(self, value: Value) -> None:
        analysis = self.analysis
        produced = analysis.producer_color(value)
        use_color, reads_as_made = analysis.use_color, analysis.reads_as_made
        if produced != OFFLINE and not value.output_of and all(
                use_color(n, i) is produced or reads_as_made(n, i) for n, i in value.uses):
            if produced is Color.LOW:
                self._set_type(value.key[0], value.name, self.low)
            return  # read as it is made: the common case inside a region of one precision, no cast
        needs = self._needs(value)
        output_color = {analysis.output_color(g) for g in value.output_of}
        if produced == OFFLINE:
            self._convert_constant(value, needs, output_color)
            return
        if produced is Color.LOW:
            self._set_type(value.key[0], value.name, self.low)
        other = Color.FP32 if produced is Color.LOW else Color.LOW
        if other in output_color:
            # The graph output keeps the name: the producer's value is renamed and the cast takes the name.
            new_name = self.names.fresh(f"{value.name}_{_short(analysis, produced)}")
            self._rename(value, new_name, keep=needs[other])
            self._set_type(value.key[0], value.name, self._onnx_type(other))
            self._add_cast(value, new_name, value.name, other)
        elif needs.get(other):
            cast_name = self.names.fresh(f"{value.name}_{_short(analysis, other)}")
            for node_id, i in needs[other]:
                analysis.index.nodes[node_id].proto.input[i] = cast_name
            self._add_cast(value, value.name, cast_name, other)

    def _add_cast(self, value: Value, source: str, target: str, color: Color) -> None:
        to = self._onnx_type(color)
        producer = self.analysis.index.producer_node(value)
        if producer is not None and producer.op_type == "Cast" and producer.domain == "":
            # Fold the chain: casting the Cast's own input rounds once, as the original model did.
            source = producer.proto.input[0]
        cast = self.builder.child()
        cast.op("Cast", source, outputs=[target], name=self.names.fresh(f"{target}_cast"), to=to)
        self.edits.after(self.analysis.index, value, cast.nodes)
        self.stats.casts += 1

    def _rename(self, value: Value, new_name: str, keep: list[tuple[int, int]]) -> None:
        """Rename the producer's output; readers in ``keep`` stay on the old name (the cast)."""
        index = self.analysis.index
        assert value.producer is not None  # a value renamed is a node's output
        node_id, k = value.producer
        index.nodes[node_id].proto.output[k] = new_name
        kept = set(keep)
        for node_id, i in value.uses:
            if (node_id, i) not in kept:
                index.nodes[node_id].proto.input[i] = new_name

    # -- constants -----------------------------------------------------------------------------
    def _convert_constant(self, value: Value, needs, output_color) -> None:
        if not needs.get(Color.LOW):
            return
        shared = bool(needs.get(Color.FP32)) or bool(output_color)
        if value.source == INITIALIZER:
            tensor = self.analysis.index.initializers[value.key]
            if shared:
                graph = self.analysis.index.graphs[value.key[0]].proto
                copy = graph.initializer.add()  # add(), not append(): append would store a copy of it
                copy.CopyFrom(tensor)
                copy.name = self.names.fresh(f"{value.name}_{self.analysis.precision.short}")
                if self.analysis.index.model.ir_version < 4:  # IR < 4 lists every initializer as an input
                    graph.input.append(helper.make_tensor_value_info(copy.name, self.low, list(copy.dims)))
                self._redirect(needs[Color.LOW], copy.name)
                tensor, self.stats.initializer_copies = copy, self.stats.initializer_copies + 1
            else:
                self._set_type(value.key[0], value.name, self.low)
            self._convert_tensor(tensor, value.key[0])
            self.stats.initializers_converted += 1
            return
        producer = self.analysis.index.producer_node(value)
        assert producer is not None, "an offline value that is no initializer is a Constant's output"
        if shared:
            node = onnx.NodeProto()
            node.CopyFrom(producer.proto)
            node.name = self.names.fresh(f"{producer.label}_{self.analysis.precision.short}")
            node.output[0] = self.names.fresh(f"{value.name}_{self.analysis.precision.short}")
            self._redirect(needs[Color.LOW], node.output[0])
            _set_constant(node, self._converted(constant_tensor(node)))
            self.edits.after(self.analysis.index, value, [node])
        else:
            self._set_type(value.key[0], value.name, self.low)
            _set_constant(producer.proto, self._converted(constant_tensor(producer.proto)))
        self.stats.constants_converted += 1

    def _redirect(self, uses, name: str) -> None:
        for node_id, i in uses:
            self.analysis.index.nodes[node_id].proto.input[i] = name

    def _convert_tensor(self, tensor: onnx.TensorProto, graph_id: int) -> None:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor.external_data.add(key=SOURCE_TYPE_KEY, value=str(tensor.data_type))
            tensor.data_type = self.low
        elif self.defer and graph_id == 0:
            self.stats.deferred[tensor.name] = self.analysis.precision
        else:
            convert_embedded(tensor, self.analysis.precision)

    def _converted(self, tensor: onnx.TensorProto | None) -> onnx.TensorProto:
        assert tensor is not None, "KeepUnfitConstants keeps the readers of a Constant of no dense tensor float32"
        array = read_array(tensor, self.analysis.base_dir)
        out = numpy_helper.from_array(array.astype(self.analysis.precision.numpy_type), tensor.name)
        return out

    # -- helpers -------------------------------------------------------------------------------
    def _onnx_type(self, color: Color) -> int:
        return self.low if color is Color.LOW else FLOAT

    def _set_type(self, graph_id: int, name: str, elem_type: int) -> None:
        self.stats.retyped[graph_id, name] = elem_type
        for info in self.infos[graph_id].get(name, ()):
            if info.type.HasField("tensor_type"):
                info.type.tensor_type.elem_type = elem_type


def _newest_opset(model: onnx.ModelProto) -> int:
    """The newest default-domain opset the model's IR version allows (casts need the default domain)."""
    return max((row[2] for row in helper.VERSION_TABLE if row[1] <= model.ir_version), default=13)


def _short(analysis: Analysis, color: Color | str) -> str:
    return analysis.precision.short if color is Color.LOW else "fp32"


def _value_infos(analysis: Analysis) -> dict[int, dict[str, list[onnx.ValueInfoProto]]]:
    infos: dict[int, dict[str, list[onnx.ValueInfoProto]]] = {}
    for graph in analysis.index.graphs:
        by_name: dict[str, list[onnx.ValueInfoProto]] = defaultdict(list)
        for info in (*graph.proto.input, *graph.proto.output, *graph.proto.value_info):
            by_name[info.name].append(info)
        infos[graph.id] = by_name
    return infos


def _set_constant(node: onnx.NodeProto, tensor: onnx.TensorProto) -> None:
    """Make a Constant or ConstantOfShape node hold ``tensor`` as its ``value``."""
    kept = [a for a in node.attribute if a.name not in ("value", "value_float", "value_floats")]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(helper.make_attribute("value", tensor))


def _retype_attribute(node: Node, low: int, analysis: Analysis) -> None:
    """Point the attribute that fixes a low node's output type at the low type."""
    name = RETYPED_BY_ATTRIBUTE.get((node.domain, node.op_type))
    if name is None:
        return
    attr = next((a for a in node.proto.attribute if a.name == name), None)
    if attr is not None and attr.type == AttributeProto.INT:
        attr.i = low
    elif node.op_type == "ConstantOfShape":
        array = read_array(attr.t, None) if attr is not None else np.zeros(1, np.float32)
        _set_constant(node.proto, numpy_helper.from_array(array.astype(analysis.precision.numpy_type)))
