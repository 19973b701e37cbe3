"""ChooseMinCasts: color the free nodes so that the fewest bytes go through Cast nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from amp_rewrite.ir.graph import Value, ValueKey
from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.rewrite.analysis import OFFLINE, Analysis
from amp_rewrite.rewrite.coloring import Color

CAST_BYTES_PER_ELEMENT = 6
"""A cast between float32 and a 16-bit type reads one and writes the other."""

Term = int | Color | str
"""A free node id, a fixed color, or OFFLINE."""


class ChooseMinCasts:
    """Invariant: every free node is colored so that, with all fixed colors given, the
    bytes moved through casts (one cast per value and target type) are minimal; among
    minimal colorings the one with the fewest float32 nodes wins. Solved as a minimum
    s-t cut per connected group of free nodes.
    """

    def run(self, analysis: Analysis) -> None:
        free = set(analysis.coloring.free_nodes())
        if not free:
            return
        sizes = ValueSizes(analysis.index)
        for nodes, terms in _components(analysis, free):
            colors = _solve(sizes, nodes, terms)
            for node_id in nodes:
                op_class = analysis.coloring.decisions[node_id].op_class
                where = analysis.precision.value if colors[node_id] is Color.LOW else "float32"
                analysis.coloring.choose(node_id, colors[node_id],
                                         f"{op_class}: follows its neighbours into {where} (fewest cast bytes)")


def value_terms(analysis: Analysis, value: Value, free: set[int]) -> tuple[Term, list[Term]]:
    """The producer and the readers of a float32 value, each a free node or a fixed color."""
    producer: Term
    if value.producer and value.producer[0] in free and value.producer[1] in analysis.slots[value.producer[0]].outputs:
        producer = value.producer[0]
    else:
        producer = analysis.producer_color(value)
    readers: list[Term] = [
        n if n in free and i in analysis.slots[n].inputs else analysis.use_color(n, i) for n, i in value.uses
    ]
    readers.extend(analysis.output_color(g) for g in value.output_of)
    return producer, readers


def cast_bytes(analysis: Analysis, sizes: ValueSizes, values: list[Value], colors: Mapping[int, Color],
               free: set[int]) -> int:
    """Bytes moved through casts for ``values`` when the free nodes take ``colors``."""
    total = 0
    for value in values:
        producer, readers = value_terms(analysis, value, free)
        if producer == OFFLINE:
            continue
        made = colors.get(producer, producer) if isinstance(producer, int) else producer
        if any((colors[r] if isinstance(r, int) else r) != made for r in readers):
            total += CAST_BYTES_PER_ELEMENT * sizes.elements(value)
    return total


def _components(analysis: Analysis, free: set[int]):
    parent = {n: n for n in free}

    def find(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    values: dict[ValueKey, Value] = {}
    for node_id in free:
        for _, _, value in analysis.slot_values(node_id):
            values[value.key] = value
    terms: dict[ValueKey, tuple] = {}
    for key, value in values.items():
        producer, readers = value_terms(analysis, value, free)
        if producer == OFFLINE:
            continue  # constants are converted ahead of time: they tie nothing together
        ends = [t for t in (producer, *readers) if isinstance(t, int)]
        terms[key] = (value, producer, readers, ends[0])
        for other in ends[1:]:
            parent[find(other)] = find(ends[0])
    nodes_of: dict[int, list[int]] = defaultdict(list)
    terms_of: dict[int, list[tuple]] = defaultdict(list)
    for n in free:
        nodes_of[find(n)].append(n)
    for value, producer, readers, end in terms.values():
        terms_of[find(end)].append((value, producer, readers))
    for root, nodes in nodes_of.items():
        yield sorted(nodes), terms_of[root]


def _solve(sizes: ValueSizes, nodes: list[int], terms: list[tuple]) -> dict[int, Color]:
    """Colors for one group of free nodes, from its values' (value, producer, readers) terms."""
    if not any(Color.FP32 in (producer, *readers) for _, producer, readers in terms):
        return dict.fromkeys(nodes, Color.LOW)  # nothing pulls towards float32: all low costs nothing
    scale = len(nodes) + 1  # bytes dominate; one unit per float32 node breaks ties
    capacities: dict[tuple, int | None] = {}  # None: infinite

    def edge(tail, head, capacity: int | None) -> None:
        if tail == head or tail == "T" or head == "S":
            return  # edges out of the sink or into the source never carry flow
        old = capacities.get((tail, head), 0)
        capacities[(tail, head)] = None if capacity is None or old is None else old + capacity

    terminal = {Color.LOW: "S", Color.FP32: "T"}
    for value, producer, readers in terms:
        source = terminal.get(producer, producer)
        ends = {terminal.get(r, r) for r in readers} - {source}
        if not ends or (isinstance(source, str) and all(isinstance(e, str) for e in ends)):
            continue
        cost = CAST_BYTES_PER_ELEMENT * sizes.elements(value) * scale
        if len(ends) == 1:  # one reader side: a plain pairwise cost
            (end,) = ends
            edge(source, end, cost)
            edge(end, source, cost)
            continue
        down, up = ("down", value.key), ("up", value.key)  # one cast serves every reader
        edge(source, down, cost)
        edge(up, source, cost)
        for end in ends:
            edge(down, end, None)
            edge(end, up, None)
    for node_id in nodes:
        edge("S", node_id, 1)
    import networkx as nx  # imported here: most models never need a flow, and the import costs 80 ms
    from networkx.algorithms.flow import boykov_kolmogorov

    graph = nx.DiGraph()
    graph.add_nodes_from(("S", "T"))
    graph.add_edges_from((u, v, {} if c is None else {"capacity": c}) for (u, v), c in capacities.items())
    _, (low_side, _) = nx.minimum_cut(graph, "S", "T", flow_func=boykov_kolmogorov)
    return {n: Color.LOW if n in low_side else Color.FP32 for n in nodes}
