"""SeparateNormCasts: every decomposed LayerNorm that ONNX Runtime fuses, it fuses with one type."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

import onnx
from onnx import helper

from amp_rewrite.ir.builder import Names
from amp_rewrite.ir.graph import ValueKey
from amp_rewrite.ir.precision import Precision
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.passes.base import Pass, PassResult
from amp_rewrite.rewrite.passes.insert_casts import Rewrite

MIN_OPSET = 5
"""Reshape reads its target as an input from opset 5."""

INPUT, OUTPUT = "input", "output"
"""Where a LayerNorm is separated: between its leading Cast and its statistics, or between its
scaling and its weight."""


class SeparateNormCasts(Pass[Rewrite]):
    """Invariant: for every decomposed LayerNorm (``mean = ReduceMean(x); d = Sub(x, mean); ...
    n = Div(d, _); y = Add(Mul(n, scale), bias)``), the LayerNormalization that ONNX Runtime's
    LayerNormFusion (on by default, every provider) would make of it reads its input, scale
    and bias in one type, or the fusion is kept from matching by a Reshape of a value to its
    own shape, which costs no copy.

    The fusion (ONNX Runtime 1.31.1) looks through Casts: through a leading Cast whose output
    only the ReduceMean and its Sub read, it takes the Cast's input; through a Cast after the
    Div, and after the Mul, it takes the weight and bias as they are. ONNX's
    LayerNormalization refuses mixed types, so a mismatch means the session is never created
    ("Type parameter (T) of Optype (LayerNormalization) bound to different types"). Mixed
    precision makes them: a float32 LayerNorm after a float16 producer, a model's Cast of an
    integer mask whose float16 readers now read their own Cast, a float32 stream into a
    LayerNorm whose weight and bias run float16.

    - input, scale and bias of one type (a float16 stream through a LayerNorm whose statistics
      are float32 and whose weight and bias are float16): left alone; ONNX Runtime fuses it
      into one float16 LayerNormalization, its Casts included, that computes in float32.
    - a leading Cast, and scale and bias of the statistics' type: ``x`` goes through the
      Reshape after the Cast, and ONNX Runtime fuses a LayerNormalization of the Cast's output.
    - scale and bias of another type than the input: the Mul reads the scaling through the
      Reshape, and the LayerNorm is not fused.
    """

    def run(self, rewrite: Rewrite) -> PassResult:
        """Separate every such LayerNorm, with a note saying how many. The types are as InsertCasts
        left them (``rewrite.stats``: the values it retyped, the top-level initializers that
        ``io.save`` will convert)."""
        analysis, stats = rewrite.analysis, rewrite.stats
        index = analysis.index
        if index.opsets.get("", 1) < MIN_OPSET:
            return PassResult(False)
        graphs_with_means = {node.graph for node in index.nodes
                             if node.op_type == "ReduceMean" and node.domain == "" and node.proto.input}
        names: Names | None = None
        separated = 0
        for graph_id in graphs_with_means:
            graph = index.graphs[graph_id].proto
            type_of = _types(analysis, graph_id, graph, stats.deferred if graph_id == 0 else {}, stats.retyped)
            # from the last: the positions of earlier ones stay valid
            for position, name, readers in sorted(_separations(graph, type_of), reverse=True):
                names = names or Names.of_model(index.model)
                shape, kept = names.fresh(f"{name}_shape"), names.fresh(f"{name}_unfused")
                for reader in readers:
                    reader.input[:] = [kept if n == name else n for n in reader.input]
                graph.node.insert(position, helper.make_node("Reshape", [name, shape], [kept],
                                                             name=names.fresh(f"{kept}_reshape")))
                graph.node.insert(position, helper.make_node("Shape", [name], [shape],
                                                             name=names.fresh(f"{shape}_node")))
                separated += 1
        if not separated:
            return PassResult(False)
        return PassResult(True, (f"{separated} decomposed LayerNorm(s) read a value through a Reshape that keeps "
                                 "its shape: ONNX Runtime's LayerNormFusion would otherwise fuse them into a "
                                 "LayerNormalization of mixed types and refuse the model",))


def _separations(graph: onnx.GraphProto, type_of: Callable[[str], int | None]
                 ) -> list[tuple[int, str, list[onnx.NodeProto]]]:
    """(position of its first reader, the value, its readers there) for each Reshape to insert."""
    producer: dict[str, onnx.NodeProto] = {}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    position: dict[int, int] = {}
    nodes = list(graph.node)  # one wrapper per node: readers and producers compare by identity
    for at, node in enumerate(nodes):
        position[id(node)] = at
        for name in node.output:
            producer[name] = node
        for name in node.input:
            readers[name].append(node)
    outputs = {info.name for info in graph.output}
    found = []
    for mean in [n for n in nodes if n.op_type == "ReduceMean" and n.domain in ("", "ai.onnx") and n.input]:
        x = mean.input[0]
        subs = [r for r in readers[mean.output[0]] if r.op_type == "Sub" and list(r.input) == [x, mean.output[0]]]
        if not subs:
            continue
        cast = producer.get(x)
        lead = (cast is not None and cast.op_type == "Cast" and cast.domain in ("", "ai.onnx") and x not in outputs
                and all(r is mean or any(r is s for s in subs) for r in readers[x]))
        affine = _affine(subs, producer, readers, outputs)
        where = _where(type_of(x), type_of(cast.input[0]) if lead and cast is not None else None, lead,
                       None if affine is None else (type_of(affine[2]), type_of(affine[3])))
        if where == INPUT:
            found.append((min(position[id(r)] for r in readers[x]), x, readers[x]))
        elif where == OUTPUT and affine is not None:  # (OUTPUT only where there is one)
            mul, scaled = affine[0], affine[1]
            found.append((position[id(mul)], scaled, [mul]))
    return found


def _where(stats: int | None, cast_input: int | None, lead: bool,
           affine: tuple[int | None, int | None] | None) -> str | None:
    """Where to separate a LayerNorm whose statistics read type ``stats`` (through a leading
    Cast of a ``cast_input`` where ``lead``) and whose weight and bias have the types
    ``affine`` (None: no weight and bias that the fusion takes), or None."""
    fused = cast_input if lead else stats
    if affine is None or None in affine or affine[0] != affine[1]:
        return INPUT if lead else None  # no fusion of all three, or types unknown: as the statistics read
    scale = affine[0]
    if scale == fused:
        return None
    return INPUT if lead and scale == stats else OUTPUT


def _affine(subs: list[onnx.NodeProto], producer: Mapping[str, onnx.NodeProto],
            readers: Mapping[str, list[onnx.NodeProto]], outputs: set[str]
            ) -> tuple[onnx.NodeProto, str, str, str] | None:
    """(the Mul, the scaled value it reads, scale, bias) of ``Add(Mul(Div(d, _), scale), bias)``
    with ``d`` one of ``subs``' outputs, each step through at most one Cast, or None."""
    for sub in subs:
        for div in readers[sub.output[0]]:
            if div.op_type != "Div" or div.input[0] != sub.output[0]:
                continue
            scaled = _through_cast(div.output[0], readers, outputs)
            mul = _only_reader(scaled, readers, outputs, "Mul")
            if mul is None:
                continue
            scale = mul.input[1] if mul.input[0] == scaled else mul.input[0]
            add = _only_reader(_through_cast(mul.output[0], readers, outputs), readers, outputs, "Add")
            if add is None:
                continue
            made = {mul.output[0], *(r.output[0] for r in readers[mul.output[0]] if r.op_type == "Cast")}
            bias = add.input[1] if add.input[0] in made else add.input[0]
            return mul, scaled, scale, bias
    return None


def _through_cast(name: str, readers: Mapping[str, list[onnx.NodeProto]], outputs: set[str]) -> str:
    """The output of the one Cast that alone reads ``name``, else ``name``."""
    cast = _only_reader(name, readers, outputs, "Cast")
    return cast.output[0] if cast is not None else name


def _only_reader(name: str, readers: Mapping[str, list[onnx.NodeProto]], outputs: set[str],
                 op_type: str) -> onnx.NodeProto | None:
    found = readers.get(name, [])
    if len(found) != 1 or name in outputs or found[0].op_type != op_type or found[0].domain not in ("", "ai.onnx"):
        return None
    return found[0]


def _types(analysis: Analysis, graph_id: int, graph: onnx.GraphProto, deferred: Mapping[str, Precision],
           retyped: Mapping[ValueKey, int]) -> Callable[[str], int | None]:
    """The element type of a value of ``graph`` after InsertCasts, by name (None: unknown)."""
    known: dict[str, int] = {}
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.type.HasField("tensor_type"):
            known[info.name] = info.type.tensor_type.elem_type
    for tensor in graph.initializer:
        known[tensor.name] = deferred[tensor.name].onnx_type if tensor.name in deferred else tensor.data_type
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Cast":
            known[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
        elif node.op_type == "Constant":
            value = next((a for a in node.attribute if a.name == "value"), None)
            if value is not None:
                known[node.output[0]] = value.t.data_type

    def type_of(name: str) -> int | None:
        if name in known:
            return known[name]
        value = analysis.index.values.get((graph_id, name))
        if value is None or not value.elem_type:
            return None
        return retyped.get(value.key, value.elem_type)

    return type_of
