"""ChooseMinCasts: color the free nodes so that the fewest bytes go through Cast nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping

from amp_rewrite.ir.graph import Value, ValueKey
from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.rewrite.analysis import OFFLINE, Analysis
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.min_cut import INFINITE, Edge, min_cut
from amp_rewrite.rewrite.norms import Use, fused_layer_norm_reads, layer_norms_end_regions
from amp_rewrite.rewrite.passes.base import Pass, PassResult

CAST_BYTES_PER_ELEMENT = 6
"""A cast between float32 and a 16-bit type reads one and writes the other."""

Term = int | Color | str
"""A free node id, a fixed color, or OFFLINE."""


class ChooseMinCasts(Pass[Analysis]):
    """Invariant: every free node is colored so that, with all fixed colors given, the
    bytes moved through casts (one cast per value and target type) are minimal; among
    minimal colorings the one with the fewest float32 nodes wins. A connected group of free
    nodes with no fixed float32 end goes low, which costs nothing; each other group is a
    minimum cut between the low and the float32 side, with the largest low side of all.
    Where written-out LayerNorms end their float32 regions (``norms.layer_norms_end_regions``),
    each that ONNX Runtime fuses into one LayerNormalization counts as its weight reading the
    norm's input (``norms.fused_layer_norm_reads``): the Casts into its float32 statistics and
    out of its scaling vanish into the fused norm where the input and the weight share a type,
    and one of them remains where they do not.
    """

    def run(self, analysis: Analysis) -> PassResult:
        sizes = ValueSizes(analysis.index, analysis.inferred)
        free = set(analysis.coloring.free_nodes())
        if not free:
            return PassResult(False)
        fused = fused_layer_norm_reads(analysis) if layer_norms_end_regions(analysis) else {}
        float32: set[int] = set()
        for nodes, terms in _pulled_groups(analysis, free, fused):
            float32 |= _float32_nodes(sizes, nodes, terms)
        low, before = analysis.precision.value, analysis.coloring.changes
        for node_id in free:
            decision = analysis.coloring.decisions[node_id]
            color = Color.FP32 if node_id in float32 else Color.LOW
            where = "float32" if node_id in float32 else low
            analysis.coloring.choose(node_id, color,
                                     f"{decision.op_class}: follows its neighbours into {where} (fewest cast bytes)")
        return PassResult(analysis.coloring.changes != before)


def value_terms(analysis: Analysis, value: Value, free: set[int],
                fused: Mapping[Use, Use | None] | None = None) -> tuple[Term, list[Term]]:
    """The producer and the readers of a float32 value, each a free node or a fixed color;
    ``fused``: reads that count as another read, or (None) as none."""
    slots = analysis.slots
    producer: Term
    if value.producer and value.producer[0] in free and value.producer[1] in slots[value.producer[0]].outputs:
        producer = value.producer[0]
    else:
        producer = analysis.producer_color(value)
    uses = value.uses if not fused else [fused.get(use, use) for use in value.uses]
    readers: list[Term] = [n if n in free and i in slots[n].inputs else analysis.use_color(n, i)
                           for n, i in filter(None, uses) if not analysis.reads_as_made(n, i)]
    if value.output_of:
        readers += [analysis.output_color(g) for g in value.output_of]
    return producer, readers


def cast_bytes(analysis: Analysis, sizes: ValueSizes, values: list[Value], colors: Mapping[int, Color],
               free: set[int], fused: Mapping[Use, Use | None] | None = None) -> int:
    """Bytes moved through casts for ``values`` when the free nodes take ``colors`` (``fused``:
    as ``value_terms`` takes it)."""
    total = 0
    for value in values:
        producer, readers = value_terms(analysis, value, free, fused)
        if producer == OFFLINE:
            continue
        made = colors.get(producer, producer) if isinstance(producer, int) else producer
        if any((colors[r] if isinstance(r, int) else r) != made for r in readers):
            total += CAST_BYTES_PER_ELEMENT * sizes.elements(value)
    return total


def _pulled_groups(analysis: Analysis, free: set[int],
                   fused: Mapping[Use, Use | None]) -> Iterator[tuple[list[int], list[tuple]]]:
    """The connected groups of free nodes that some fixed float32 end pulls on, each with its
    values' (value, producer, readers) terms. Constants tie nothing together: they are
    converted ahead of time."""
    index, slots = analysis.index, analysis.slots
    keys: dict[ValueKey | None, None] = {}  # slots hold keys that are there
    for node_id in free:
        node, slot = index.nodes[node_id], slots[node_id]
        for i in slot.inputs:
            keys[node.inputs[i]] = None
        for i in slot.outputs:
            keys[node.outputs[i]] = None
    for (node_id, i), weight in fused.items():  # a fused norm's input, read at its free weight
        if weight is not None and weight[0] in free:
            keys[index.nodes[node_id].inputs[i]] = None
    parent = {n: n for n in free}

    def find(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    terms: list[tuple[int, tuple]] = []  # (a free end, the term)
    pulled: list[int] = []
    for key in keys:
        value = index.value(key)
        producer, readers = value_terms(analysis, value, free, fused)
        if producer == OFFLINE:
            continue
        ends = [t for t in (producer, *readers) if isinstance(t, int)]
        if not ends:  # read by free nodes only where they convert on their own (reads_as_made)
            continue
        if len(ends) > 1:
            root = find(ends[0])
            for other in ends[1:]:
                parent[find(other)] = root
        terms.append((ends[0], (value, producer, readers)))
        if producer is Color.FP32 or Color.FP32 in readers:
            pulled.append(ends[0])
    root_of = {n: find(n) for n in free}
    roots = {root_of[n] for n in pulled}
    nodes_of: dict[int, list[int]] = defaultdict(list)
    terms_of: dict[int, list[tuple]] = defaultdict(list)
    for n, root in root_of.items():
        if root in roots:
            nodes_of[root].append(n)
    for end, term in terms:
        if (root := root_of[end]) in roots:
            terms_of[root].append(term)
    for root, nodes in nodes_of.items():
        yield nodes, terms_of[root]


def _float32_nodes(sizes: ValueSizes, nodes: list[int], terms: list[tuple]) -> set[int]:
    """The nodes of one group of free nodes that go float32, from its values' (value, producer,
    readers) terms. A cut between the low and the float32 side crosses, for each value, its
    cast's bytes when the cast is needed. The low side is the largest of all minimum cuts: it
    holds every other one's, so among the colorings with the fewest cast bytes this one has the
    fewest float32 nodes."""
    number: dict[Term, int] = {Color.LOW: 0, Color.FP32: 1}
    number.update(zip(nodes, range(2, len(nodes) + 2)))
    size = len(number)
    edges: list[Edge] = []  # (tail, head, bytes): paid when the tail is low and the head float32
    for value, producer, readers in terms:
        source = number[producer]
        ends = {number[r] for r in readers}
        ends.discard(source)
        if not ends or (source < 2 and all(end < 2 for end in ends)):
            continue  # no cast, or one that no choice avoids
        cost = CAST_BYTES_PER_ELEMENT * sizes.elements(value)
        if len(ends) == 1:  # one reader side: a plain pairwise cost
            (end,) = ends
            edges += ((source, end, cost), (end, source, cost))
            continue
        down, up = size, size + 1  # one cast serves every reader: down is float32 if any reader is,
        size += 2  # up is low if any reader is
        edges += ((source, down, cost), (up, source, cost))
        for end in ends:
            edges += ((down, end, INFINITE), (end, up, INFINITE))
    _, low_side = min_cut(size, edges, number[Color.LOW], number[Color.FP32])
    return {n for n in nodes if not low_side[number[n]]}
