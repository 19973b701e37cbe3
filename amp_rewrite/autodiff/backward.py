"""Reverse mode over an ONNX graph, one registered rule per op.

Invariant: for each target, ``run`` returns a value holding the gradient of
the seeded values (sum over seeds of seed x value) with respect to it, built
from standard ONNX ops only. Nodes are visited in reverse graph order, and
only those on a path from a target to a seed through differentiable inputs;
gradient contributions to a value read by several nodes are summed with one
``Sum``; rules read the forward's own values (nothing is recomputed). Values
that are not float (shapes, indices, masks) carry no gradient, so integer and
shape paths need no rule; the one exception is the integer output of an op
whose rule is ``straight_through`` (QuantizeLinear's). ``check`` finds every
op without a rule, subgraph bodies included, before anything is built.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
from onnx import numpy_helper

from amp_rewrite.autodiff import rules as _rules  # noqa: F401 (registers the rules)
from amp_rewrite.autodiff.context import Context, total
from amp_rewrite.autodiff.registry import Rule, lookup, missing_rule_error
from amp_rewrite.ir.builder import FLOAT_TYPES, GraphBuilder
from amp_rewrite.ir.graph import ModelIndex, Node, ValueKey
from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.ir.tensors import constant_tensor, external_location
from amp_rewrite.ir.types import SUBGRAPH_OUTPUT_OFFSET


class Backward:
    """The backward pass over one model (its index is built once; the model is edited only by
    the nodes the caller appends and by rules that export values from subgraphs)."""

    def __init__(self, index: ModelIndex, *, conv_weight_grad: str = "direct") -> None:
        self.index = index
        self.conv_weight_grad = conv_weight_grad
        """How Conv weight gradients are formulated (see ``conv_weight_grad.MODES``)."""
        sizes = ValueSizes(index)
        self.shapes = {v.key: sizes.shape(v) for v in index.all_values()}
        self._nodes: dict[int, list[Node]] = defaultdict(list)
        for node in index.nodes:
            self._nodes[node.graph].append(node)
        self._closures: dict[int, list[ValueKey]] = {}

    # -- what the graph says ----------------------------------------------------------------------
    def rule(self, node: Node) -> Rule | None:
        return lookup(node.domain, node.op_type, self.index.opset(node))

    def input_keys(self, node: Node) -> list[ValueKey | None]:
        """The node's inputs, then the outer values its subgraphs read (its closure)."""
        return [*node.inputs, *self.closure(node)]

    def closure(self, node: Node) -> list[ValueKey]:
        """Values defined outside ``node``'s subgraphs that nodes or outputs inside them read."""
        if node.id not in self._closures:
            inside: set[int] = set()
            pending = list(self.index.subgraphs.get(node.id, ()))
            while pending:
                graph_id = pending.pop()
                inside.add(graph_id)
                for inner in self._nodes[graph_id]:
                    pending.extend(self.index.subgraphs.get(inner.id, ()))
            read: dict[ValueKey, None] = {}
            for graph_id in sorted(inside):
                for inner in self._nodes[graph_id]:
                    read.update((k, None) for k in inner.inputs if k is not None and k[0] not in inside)
                read.update((k, None) for k in self.index.graphs[graph_id].outputs if k[0] not in inside)
            self._closures[node.id] = list(read)
        return self._closures[node.id]

    def is_float(self, key: ValueKey) -> bool:
        return self.index.values[key].elem_type in FLOAT_TYPES

    def carries_gradient(self, key: ValueKey) -> bool:
        """A float value, or an integer one made by an op whose rule is ``straight_through``."""
        if self.is_float(key):
            return True
        producer = self.index.producer_node(self.index.values[key])
        rule = self.rule(producer) if producer is not None else None
        return rule is not None and rule.straight_through

    def differentiable(self, node: Node, i: int, key: ValueKey | None) -> bool:
        if key is None or not self.carries_gradient(key):
            return False
        rule = self.rule(node)
        return rule is None or not (rule.zero or i in rule.constant)

    def key_of(self, graph_id: int, name: str) -> ValueKey | None:
        graph: int | None = graph_id
        while graph is not None:
            key = self.index.graphs[graph].scope.get(name)
            if key is not None:
                return key
            graph = self.index.graphs[graph].parent
        return None

    def constant(self, graph_id: int, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant output (axes, shapes, pads), or None."""
        key = self.key_of(graph_id, name) if name else None
        if key is None:
            return None
        tensor = self.index.initializers.get(key)
        if tensor is None:
            producer = self.index.producer_node(self.index.values[key])
            if producer is None or producer.op_type != "Constant" or producer.domain != "":
                return None
            tensor = constant_tensor(producer.proto)
        return None if tensor is None or external_location(tensor) else numpy_helper.to_array(tensor)

    def shape(self, graph_id: int, name: str) -> tuple | None:
        key = self.key_of(graph_id, name)
        return self.shapes.get(key) if key is not None else None

    # -- planning ---------------------------------------------------------------------------------
    def plan(self, graph_id: int, seeds: Iterable[ValueKey], targets: Iterable[ValueKey]
             ) -> tuple[list[Node], set[ValueKey], set[ValueKey]]:
        """(nodes to differentiate in graph order, values that depend on a target, values the
        seeds depend on through those nodes)."""
        nodes = self._nodes[graph_id]
        active = set(targets)
        for node in nodes:
            keys = self.input_keys(node)
            if any(k in active and self.differentiable(node, i, k) for i, k in enumerate(keys)):
                active.update(k for k in node.outputs if k is not None and self.carries_gradient(k))
        needed = set(seeds)
        chosen = []
        for node in reversed(nodes):
            if not any(k in needed for k in node.outputs if k is not None):
                continue
            keys = self.input_keys(node)
            inputs = [k for i, k in enumerate(keys) if k in active and self.differentiable(node, i, k)]
            if inputs:
                chosen.append(node)
                needed.update(inputs)
        chosen.reverse()
        return chosen, active, needed

    def check(self, graph_id: int, seeds: Iterable[ValueKey], targets: Iterable[ValueKey]) -> set[ValueKey]:
        """Raise one UserError naming the ops on the path that have no gradient rule; else return
        the values the seeds depend on (see ``plan``)."""
        missing: list[tuple[str, str, int, str]] = []
        needed = self._find_missing(graph_id, list(seeds), list(targets), missing)
        if missing:
            raise missing_rule_error(missing)
        return needed

    def _find_missing(self, graph_id: int, seeds: list[ValueKey], targets: list[ValueKey],
                      missing: list) -> set[ValueKey]:
        chosen, active, needed = self.plan(graph_id, seeds, targets)
        for node in chosen:
            if self.rule(node) is None:
                missing.append((node.domain, node.op_type, self.index.opset(node), node.label))
                continue
            offset = SUBGRAPH_OUTPUT_OFFSET.get(node.op_type, 0)  # a Loop body's first output is its condition
            for body in self.index.subgraphs.get(node.id, ()):
                graph = self.index.graphs[body]
                body_seeds = [graph.outputs[i + offset] for i, k in enumerate(node.outputs)
                              if k in needed and i + offset < len(graph.outputs)]
                states = [graph.scope[i.name] for i in graph.proto.input[offset + 1:]] if offset else []
                body_targets = [k for k in self.closure(node) if k in active] + states
                self._find_missing(body, body_seeds, body_targets, missing)
        return needed

    # -- building ---------------------------------------------------------------------------------
    def run(self, graph_id: int, seeds: dict[ValueKey, str], targets: Sequence[ValueKey],
            b: GraphBuilder) -> dict[ValueKey, str]:
        """Append to ``b`` the nodes computing each target's gradient; return them by target
        (a target nothing reaches is absent)."""
        chosen, active, _ = self.plan(graph_id, seeds, targets)
        grads: dict[ValueKey, list[str]] = defaultdict(list)
        for key, seed in seeds.items():
            grads[key].append(seed)
        for node in reversed(chosen):
            go = [total(b, grads.pop(k)) if k is not None and k in grads else None for k in node.outputs]
            if all(g is None for g in go):
                continue
            keys = self.input_keys(node)
            wanted = [k in active and self.differentiable(node, i, k) for i, k in enumerate(keys)]
            ctx = Context(self, node, graph_id, b, [k[1] if k else "" for k in keys], go, wanted)
            rule = self.rule(node)
            assert rule is not None  # check() refused a node with no rule
            for i, grad in rule.build(ctx).items():
                if grad is not None and wanted[i] and (input_key := keys[i]) is not None:  # wanted: it has one
                    grads[input_key].append(grad)
        return {t: total(b, grads[t]) for t in targets if grads.get(t)}

