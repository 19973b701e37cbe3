"""Rules: If and Loop, whose bodies shape inference reads as graphs of their own.

A Loop body's carried input whose shape its carried output keeps has its initial value's
dimensions (where inference named the body's ``?`` afresh); a Loop that runs to its constant
trip count M stacks M of each scan output. An If's output has the dimensions that both its
branches give it.
"""

from __future__ import annotations

from amp_rewrite.inputs.dims.counting import Solver
from amp_rewrite.inputs.dims.registry import rule
from amp_rewrite.ir.graph import Node


@rule("If")
def _if(rules: Solver, node: Node) -> None:
    """An output has the dimensions that both branches give it (inference merges only names
    that are the same: a Pad by one in one branch and a Concat of one row in the other are
    both ``batch + 1``, under two fresh names)."""
    branches = rules.index.subgraphs.get(node.id) or []
    if len(branches) != 2:
        return
    outputs = zip(*(rules.index.graphs[branch].outputs for branch in branches))
    for key, pair in zip(node.outputs, outputs):
        then, other = (rules.shape(k) for k in pair)
        if then is not None and then == other:
            rules.derive(key, then)


@rule("Loop")
def _loop(rules: Solver, node: Node) -> None:
    """A body's carried input that its carried output keeps the shape of has, at every
    iteration, its initial value's shape (a fresh name that inference gave the body's ``?``
    stands for the initial value's dimension). A Loop that runs to its constant trip count M
    (its body passes the condition on as it came) stacks M of each scan output: their first
    dimension is M."""
    bodies = rules.index.subgraphs.get(node.id)
    if not bodies:
        return
    body = rules.index.graphs[bodies[0]]
    for info, kept, initial in zip(body.proto.input[2:], body.outputs[1:], node.inputs[2:]):
        key = body.scope.get(info.name)
        shape = rules.shape(key)
        if shape is not None and shape == rules.shape(kept) and (start := rules.shape(initial)) is not None:
            rules.derive(key, start)
    trips = rules.constant(node.inputs[0] if node.inputs else None)
    graph = body.proto
    if trips is None or trips.size != 1 or len(graph.input) < 2 or not graph.output:
        return
    kept, condition = graph.input[1].name, graph.output[0].name
    if condition != kept and not any(n.op_type == "Identity" and list(n.input) == [kept] and condition in n.output
                                     for n in graph.node):
        return
    for key in node.outputs[len(node.inputs) - 2:]:
        inferred = rules.index.values[key].shape if key is not None else None
        if inferred:
            rules.derive(key, [int(trips[0]), *[None] * (len(inferred) - 1)])
