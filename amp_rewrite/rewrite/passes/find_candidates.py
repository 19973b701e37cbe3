"""FindCandidates: find the nodes whose float32 tensors may change precision."""

from __future__ import annotations

import functools

from amp_rewrite.ir.graph import Node
from amp_rewrite.ir.schemas import signature
from amp_rewrite.policy.oplists import CONTROL_FLOW, RETYPED_BY_ATTRIBUTE
from amp_rewrite.rewrite.analysis import FLOAT, Analysis, Slots
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class FindCandidates(Pass[Analysis]):
    """Invariant: ``analysis.slots`` holds exactly the nodes with at least one input or
    output bound to a schema type parameter that is float32 at every slot, admits the
    target type, binds an input (or an attribute fixes it), and is not kept float32 by
    the op lists. Ops with no schema that touch
    float32 tensors are counted in ``analysis.unknown_ops``; they keep their types.
    """

    def run(self, analysis: Analysis) -> PassResult:
        found = len(analysis.slots)
        # Nodes of one op with the same inputs and outputs present share their eligible parameters,
        # and nodes whose slots agree share one Slots: a transformer has a few dozen kinds of node.
        self._eligible: dict[tuple, _Eligible | None] = {}
        self._shared: dict[_Eligible, Slots] = {}
        for node in analysis.index.nodes:
            op = (node.domain, node.op_type)
            if op in CONTROL_FLOW or op == ("", "Constant"):
                continue
            slots = self._slots(analysis, node)
            if slots is not None:
                analysis.slots[node.id] = slots
        return PassResult(len(analysis.slots) != found)

    def _slots(self, analysis: Analysis, node: Node) -> Slots | None:
        values = analysis.index.values
        eligible = self._eligible_for(analysis, node)
        if eligible is None:
            if any(k is not None and values[k].elem_type == FLOAT for k in (*node.inputs, *node.outputs)):
                analysis.unknown_ops[node.qualified_op] += 1
            return None
        chosen = _float_params(values, node, eligible)
        if not chosen or ((node.domain, node.op_type) in RETYPED_BY_ATTRIBUTE and not any(e[2] for e in chosen)):
            return None  # nothing to convert, or an attribute fixes a non-float output type
        slots = self._shared.get(chosen)
        if slots is None:
            slots = self._shared[chosen] = Slots(frozenset(i for e in chosen for i in e[1]),
                                                 frozenset(i for e in chosen for i in e[2]),
                                                 frozenset(e[0] for e in chosen))
        return slots

    def _eligible_for(self, analysis: Analysis, node: Node) -> _Eligible | None:
        kind: tuple[str, str, tuple[bool, ...] | int, tuple[bool, ...] | int]
        if None in node.inputs or None in node.outputs:
            kind = (node.domain, node.op_type, tuple(k is not None for k in node.inputs),
                    tuple(k is not None for k in node.outputs))
        else:
            kind = (node.domain, node.op_type, len(node.inputs), len(node.outputs))
        if kind not in self._eligible:
            self._eligible[kind] = _eligible_params(
                node.domain, node.op_type, analysis.index.opset(node), tuple(k is not None for k in node.inputs),
                tuple(k is not None for k in node.outputs), analysis.precision.schema_type,
                frozenset(analysis.policy.keep_fp32_params(node.domain, node.op_type)))
        return self._eligible[kind]


def _float_params(values, node: Node, eligible: _Eligible) -> _Eligible:
    """The eligible parameters bound to float32 at every slot of ``node``."""
    chosen = []
    for e in eligible:  # loops, not all() over generators: this runs for every slot of every node
        for i in e[1]:
            if values[node.inputs[i]].elem_type != FLOAT:
                break
        else:
            for i in e[2]:
                if values[node.outputs[i]].elem_type != FLOAT:
                    break
            else:
                chosen.append(e)
    return eligible if len(chosen) == len(eligible) else tuple(chosen)


_Eligible = tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
"""(type parameter, input slots, output slots) for each eligible parameter."""


@functools.cache
def _eligible_params(domain: str, op_type: str, opset: int, inputs: tuple[bool, ...], outputs: tuple[bool, ...],
                     target: str, kept: frozenset[str]) -> _Eligible | None:
    """Per schema and present inputs/outputs: each type parameter that admits ``target``, is not
    kept float32, and binds an input (or an attribute fixes it), with the slots it binds."""
    sig = signature(domain, op_type, opset, len(inputs), len(outputs))
    if sig is None:
        return None
    retyped = (domain, op_type) in RETYPED_BY_ATTRIBUTE
    found = []
    for param, allowed in sig.allowed.items():
        ins = tuple(i for i, (formal, present) in enumerate(zip(sig.inputs, inputs)) if present and formal == param)
        outs = tuple(i for i, (formal, present) in enumerate(zip(sig.outputs, outputs)) if present and formal == param)
        if target in allowed and param not in kept and (ins or (retyped and outs)):
            found.append((param, ins, outs))  # without an input, the op derives the type itself
    return tuple(found)
