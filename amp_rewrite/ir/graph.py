"""A def-use index over an ONNX ModelProto, its subgraphs included.

The protobuf stays the model: the index is built once in O(nodes + edges) and
answers "who produces this value, who reads it, which graph defines it" in
O(1), so no pass ever scans the graph by name. Values are keyed by the graph
that defines them and their name, which keeps shadowed names in subgraphs apart.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto

ValueKey = tuple[int, str]
"""(id of the defining graph, value name)."""

NODE, GRAPH_INPUT, INITIALIZER, UNDEFINED = "node", "input", "initializer", "undefined"


@dataclass(slots=True, eq=False)
class Node:
    id: int
    proto: onnx.NodeProto
    graph: int
    position: int
    inputs: list[ValueKey | None]
    outputs: list[ValueKey | None]
    op_type: str
    domain: str
    """``""`` for the default domain, however the model spells it."""

    @property
    def qualified_op(self) -> str:
        """The op type, prefixed by its domain outside the default one (``com.microsoft.FusedMatMul``)."""
        return f"{self.domain}.{self.op_type}" if self.domain else self.op_type

    @property
    def cast_to(self) -> int | None:
        """The type a default-domain Cast converts to; None for any other node."""
        if self.op_type != "Cast" or self.domain != "":
            return None
        return next((a.i for a in self.proto.attribute if a.name == "to"), None)

    @property
    def label(self) -> str:
        """The node's name, or a stable description when it has none."""
        return self.proto.name or f"{self.op_type}#{self.id}"


_NO_GRAPHS: tuple[int, ...] = ()


@dataclass(slots=True, eq=False)
class Value:
    key: ValueKey
    source: str
    producer: tuple[int, int] | None = None
    uses: list[tuple[int, int]] = field(default_factory=list)
    output_of: list[int] | tuple[int, ...] = _NO_GRAPHS
    """The graphs that list the value as an output (an empty tuple, shared, for most values)."""
    elem_type: int | None = None
    shape: tuple | None = None

    @property
    def name(self) -> str:
        return self.key[1]


@dataclass(slots=True, eq=False)
class Graph:
    id: int
    proto: onnx.GraphProto
    parent: int | None
    scope: dict[str, ValueKey] = field(default_factory=dict)
    outputs: list[ValueKey] = field(default_factory=list)


class ModelIndex:
    """Def-use index of a model; rebuild it after the model is edited.

    Each node's names, op type and domain are read from the protobuf once, here:
    protobuf field access costs far more than a Python attribute, and the passes
    ask these questions of every node.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.graphs: list[Graph] = []
        self.nodes: list[Node] = []
        self.values: dict[ValueKey, Value] = {}
        self.initializers: dict[ValueKey, onnx.TensorProto] = {}
        self.subgraphs: dict[int, list[int]] = {}
        self._index_graph(model.graph, None, None)

    def opset(self, node: Node) -> int:
        return self.opsets.get(node.domain, 1)

    def value(self, key: ValueKey | None) -> Value:
        """``values[key]`` for a key that a node's inputs or outputs hold: a KeyError where it is
        None (an input or output left out), as ``values[None]`` gives."""
        if key is None:
            raise KeyError(key)
        return self.values[key]

    def producer_node(self, value: Value) -> Node | None:
        return self.nodes[value.producer[0]] if value.producer else None

    def all_values(self) -> Iterator[Value]:
        return iter(self.values.values())

    def _define(self, graph: Graph, name: str, source: str, type_proto=None) -> Value:
        key = (graph.id, name)
        value = Value(key, source)
        if type_proto is not None:
            set_type(value, type_proto)
        graph.scope[name] = key
        self.values[key] = value
        return value

    def _resolve(self, graph: Graph, name: str) -> ValueKey:
        g: Graph | None = graph
        while g is not None:
            key = g.scope.get(name)
            if key is not None:
                return key
            g = self.graphs[g.parent] if g.parent is not None else None
        value = self._define(self.graphs[0], name, UNDEFINED)
        return value.key

    def _index_graph(self, proto: onnx.GraphProto, parent: int | None, owner: int | None) -> None:
        graph = Graph(len(self.graphs), proto, parent)
        self.graphs.append(graph)
        if owner is not None:
            self.subgraphs.setdefault(owner, []).append(graph.id)
        infos = {vi.name: vi.type for vi in proto.value_info}
        infos.update((vi.name, vi.type) for vi in proto.output)
        weights = {t.name for t in proto.initializer}
        for vi in proto.input:
            if vi.name not in weights:  # an initializer listed as an input (IR < 4 style) is a weight
                self._define(graph, vi.name, GRAPH_INPUT, vi.type)
        for tensor in proto.initializer:
            value = self._define(graph, tensor.name, INITIALIZER)
            value.elem_type, value.shape = tensor.data_type, tuple(tensor.dims)
            self.initializers[value.key] = tensor
        # Outputs first, then inputs: a node may read a value that a later node of its graph defines.
        nodes, values, scope, gid = self.nodes, self.values, graph.scope, graph.id
        read: list[tuple[Node, list[str]]] = []
        for position, node_proto in enumerate(proto.node):
            domain = node_proto.domain  # op types and domains repeat: one string each, not one per node
            node = Node(len(nodes), node_proto, gid, position, [], [], sys.intern(node_proto.op_type),
                        "" if domain in ("", "ai.onnx") else sys.intern(domain))
            nodes.append(node)
            outputs = node.outputs
            for i, name in enumerate(node_proto.output):
                if not name:
                    outputs.append(None)
                    continue
                key = (gid, name)
                value = Value(key, NODE, (node.id, i))
                type_proto = infos.get(name)
                if type_proto is not None:
                    set_type(value, type_proto)
                scope[name] = key
                values[key] = value
                outputs.append(key)
            read.append((node, list(node_proto.input)))
        for node, names in read:
            inputs, use = node.inputs, node.id
            for i, name in enumerate(names):
                found = scope.get(name) if name else None
                if found is None:
                    if not name:
                        inputs.append(None)
                        continue
                    found = self._resolve(graph, name)
                values[found].uses.append((use, i))
                inputs.append(found)
            if node.proto.attribute:
                for attr in node.proto.attribute:
                    if attr.type == AttributeProto.GRAPH:
                        self._index_graph(attr.g, gid, use)
                    elif attr.type == AttributeProto.GRAPHS:
                        for sub in attr.graphs:
                            self._index_graph(sub, gid, use)
        for vi in proto.output:
            key = self._resolve(graph, vi.name)
            value = values[key]
            if isinstance(value.output_of, list):  # a list once it holds a graph (the empty tuple is shared)
                value.output_of.append(gid)
            else:
                value.output_of = [gid]
            graph.outputs.append(key)


TensorType = tuple[int, tuple | None]
"""A tensor's element type (0: unknown) and shape (ints, dimension names or None; None: unknown rank)."""


def tensor_type(type_proto: onnx.TypeProto) -> TensorType | None:
    """The tensor type ``type_proto`` declares, or None for a non-tensor type."""
    if not type_proto.HasField("tensor_type"):
        return None
    declared = type_proto.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                  for d in declared.shape.dim) if declared.HasField("shape") else None
    return declared.elem_type, shape


def set_type(value: Value, type_proto: onnx.TypeProto) -> None:
    found = tensor_type(type_proto)
    if found is None:
        return
    elem_type, shape = found
    if elem_type:
        value.elem_type = elem_type
    if shape is not None:
        value.shape = shape


def node_key(node: Node) -> str:
    """What node patterns match: the node's name, or its first output's name when it has none."""
    return node.proto.name or (node.proto.output[0] if node.proto.output else "")


@dataclass
class PendingInserts:
    """Nodes waiting to be inserted: graph id -> position -> nodes to place before it."""

    inserts: dict[int, dict[int, list[onnx.NodeProto]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))

    def after(self, index: ModelIndex, value: Value, nodes: list[onnx.NodeProto]) -> None:
        """Insert ``nodes`` right after ``value``'s producer (at the graph's start for inputs and weights)."""
        producer = index.producer_node(value)
        position = producer.position + 1 if producer else 0
        self.inserts[value.key[0]][position].extend(nodes)

    def apply(self, index: ModelIndex) -> None:
        # Rebuilding a node list copies its nodes, so subgraphs (higher ids) go before their parents.
        for graph_id, at in sorted(self.inserts.items(), reverse=True):
            nodes = index.graphs[graph_id].proto.node
            if sum(map(len, at.values())) * len(nodes) <= INSERT_MOVES:
                for position in sorted(at, reverse=True):  # from the end: earlier positions stay valid
                    for node in reversed(at[position]):
                        nodes.insert(position, node)
                continue
            kept = list(nodes)
            ordered: list[onnx.NodeProto] = []
            for position in range(len(kept) + 1):
                ordered.extend(at.get(position, ()))
                if position < len(kept):
                    ordered.append(kept[position])
            del nodes[:]
            nodes.extend(ordered)


INSERT_MOVES = 1 << 24
"""An insert moves the nodes after it (one pointer each, no copy); past this many moves in a
graph, rebuilding its node list (which copies every node) is cheaper."""


def names_read(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Names that ``nodes`` (and their subgraphs) read but do not define."""
    defined: set[str] = set()
    read: set[str] = set()
    for node in nodes:
        read.update(i for i in node.input if i)
        for graph in subgraphs(node):
            inner = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            read |= (names_read(graph.node) | {o.name for o in graph.output}) - inner - \
                {o for n in graph.node for o in n.output}
        defined.update(node.output)
    return read - defined


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node's attributes hold (If branches, Loop and Scan bodies)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs
