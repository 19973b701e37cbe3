"""Minimum s-t cuts by push-relabel, over exact integer capacities.

Capacities are Python ints, so byte counts of any size stay exact (scipy's
``maximum_flow`` narrows them to 32 bits). The cut returned is the one
``networkx.minimum_cut`` returns: its sink side is the set of nodes that still reach
the sink in the residual graph of a maximum flow. That set is the same for every
maximum flow and is the smallest sink side of all minimum cuts, so the answer does
not depend on how the flow was found. It is already fixed by a maximum preflow (the
first phase of push-relabel): the second phase only returns stranded excess to the
source, among nodes that no longer reach the sink.

Push-relabel with the highest label first merges the flow that many sources feed into
one chain, where augmenting paths (Dinic, Boykov-Kolmogorov) would carry each unit
separately down the chain and take time quadratic in its length.
"""

from __future__ import annotations

from collections.abc import Iterable

INFINITE = None
"""The capacity of an edge that no finite cut may cross."""

Edge = tuple[int, int, int | None]
"""(tail, head, capacity): a directed edge between nodes ``0 .. size - 1``; parallel edges add up."""


def min_cut(size: int, edges: Iterable[Edge], source: int, sink: int) -> tuple[int, list[bool]]:
    """The value of a minimum ``source``-``sink`` cut, and its source side as a flag per node:
    the nodes that do not reach ``sink`` in the residual graph of a maximum flow (the largest
    source side of all minimum cuts)."""
    if source == sink:
        raise ValueError("the source is the sink")
    out: list[list[int]] = [[] for _ in range(size)]  # edge ids leaving each node
    heads: list[int] = []
    residual: list[int | None] = []  # edge 2k is the k-th given edge, 2k + 1 its reverse
    for tail, head, capacity in edges:
        if tail == head:
            continue  # no cut crosses it
        out[tail].append(len(heads))
        out[head].append(len(heads) + 1)
        heads += (head, tail)
        residual += (capacity, 0)
    infinite = sum(c for c in residual if c is not None) + 1  # more than any cut of finite edges
    network = _Network(out, heads, [infinite if c is None else c for c in residual])
    flow = network.max_preflow(source, sink)
    if flow >= infinite:
        raise ValueError("every cut between source and sink crosses an infinite edge")
    distance = network.distances(sink)
    return flow, [d == size for d in distance]


class _Network:
    """A residual graph in flat lists: edge ``e`` goes to ``heads[e]``, its reverse is ``e ^ 1``."""

    def __init__(self, out: list[list[int]], heads: list[int], residual: list[int]) -> None:
        self.out, self.heads, self.residual = out, heads, residual

    def distances(self, sink: int) -> list[int]:
        """Edges to ``sink`` over residual capacity, from each node (the node count: never)."""
        out, heads, residual = self.out, self.heads, self.residual
        unreached = len(out)
        distance = [unreached] * unreached
        distance[sink] = 0
        frontier = [sink]
        while frontier:
            reached = []
            for node in frontier:
                step = distance[node] + 1
                for edge in out[node]:  # its reverse ``edge ^ 1`` comes into ``node``
                    tail = heads[edge]
                    if distance[tail] == unreached and residual[edge ^ 1]:
                        distance[tail] = step
                        reached.append(tail)
            frontier = reached
        return distance

    def max_preflow(self, source: int, sink: int) -> int:
        """Push as much from ``source`` towards ``sink`` as can arrive; returns what arrived.
        Heights are distances to the sink, recomputed once the relabels have scanned as many
        edges as the network has; a node whose height reaches ``size`` no longer reaches the
        sink (nor does any node above a height that empties), and its excess stays."""
        out, heads, residual = self.out, self.heads, self.residual
        size = len(out)
        excess = [0] * size
        for edge in out[source]:
            excess[heads[edge]] += residual[edge]
            residual[edge ^ 1] += residual[edge]
            residual[edge] = 0
        work = len(heads)  # a global relabelling first
        while True:
            if work >= len(heads):
                height = self.distances(sink)
                height[source] = size
                first = [0] * size  # each node's next edge to try
                level: list[set[int]] = [set() for _ in range(size)]  # nodes by height, below ``size``
                active: list[list[int]] = [[] for _ in range(size)]  # the nodes with excess among them
                for node, h in enumerate(height):
                    if h < size:
                        level[h].add(node)
                        if excess[node] and node != sink:
                            active[h].append(node)
                top = highest = max((h for h in height if h < size), default=0)
                work = 0
            while top >= 0 and not active[top]:
                top -= 1
            if top < 0:
                return excess[sink]
            node = active[top].pop()
            if height[node] != top:
                continue  # lifted above a gap since it was queued
            edges, i, h, amount = out[node], first[node], top, excess[node]
            while amount:
                if i == len(edges):
                    work += len(edges)
                    level[h].discard(node)
                    if not level[h]:  # a gap: nothing above it reaches the sink any more
                        for above in range(h + 1, highest + 1):
                            for other in level[above]:
                                height[other] = size
                            level[above].clear()
                        highest, h = h - 1, size
                        break
                    h = size  # one above the lowest head of an edge with room left
                    for edge in edges:
                        if residual[edge] and height[heads[edge]] < h:
                            h = height[heads[edge]]
                    h += 1
                    if h >= size:
                        break
                    level[h].add(node)
                    highest = max(highest, h)
                    i = 0
                    continue
                edge = edges[i]
                head = heads[edge]
                if residual[edge] and height[head] == h - 1:
                    pushed = min(amount, residual[edge])
                    residual[edge] -= pushed
                    residual[edge ^ 1] += pushed
                    amount -= pushed
                    if not excess[head] and head != sink and head != source:
                        active[h - 1].append(head)
                    excess[head] += pushed
                    if residual[edge]:
                        continue
                i += 1
            excess[node], first[node], height[node] = amount, i, h
            top = max(top, min(h, highest))  # it pushed no higher than its last height
