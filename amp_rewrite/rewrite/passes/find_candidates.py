"""FindCandidates: find the nodes whose float32 tensors may change precision."""

from __future__ import annotations

import functools

from amp_rewrite.ir.schemas import signature
from amp_rewrite.policy.oplists import CONTROL_FLOW, RETYPED_BY_ATTRIBUTE
from amp_rewrite.rewrite.analysis import FLOAT, Analysis, Slots


class FindCandidates:
    """Invariant: ``analysis.slots`` holds exactly the nodes with at least one input or
    output bound to a schema type parameter that is float32 at every slot, admits the
    target type, binds an input (or an attribute fixes it), and is not kept float32 by
    the op lists. Ops with no schema that touch
    float32 tensors are counted in ``analysis.unknown_ops``; they keep their types.
    """

    def run(self, analysis: Analysis) -> None:
        index, policy, target = analysis.index, analysis.policy, analysis.precision.schema_type
        values, slots, unknown = index.values, analysis.slots, analysis.unknown_ops
        # Nodes of one op with the same inputs and outputs present share their eligible parameters,
        # and nodes whose slots agree share one Slots: a transformer has a few dozen kinds of node.
        eligible_of: dict[tuple, _Eligible | None] = {}
        shared: dict[tuple, Slots] = {}
        for node in index.nodes:
            domain, op_type, inputs, outputs = node.domain, node.op_type, node.inputs, node.outputs
            op = (domain, op_type)
            if op in CONTROL_FLOW or op == ("", "Constant"):
                continue
            if None in inputs or None in outputs:
                kind = (op, tuple(k is not None for k in inputs), tuple(k is not None for k in outputs))
            else:
                kind = (op, len(inputs), len(outputs))
            eligible = eligible_of.get(kind, _MISSING)
            if eligible is _MISSING:
                eligible = eligible_of[kind] = _eligible_params(
                    domain, op_type, index.opset(node), tuple(k is not None for k in inputs),
                    tuple(k is not None for k in outputs), target,
                    frozenset(policy.keep_fp32_params(domain, op_type)))
            if eligible is None:
                if any(k is not None and values[k].elem_type == FLOAT for k in (*inputs, *outputs)):
                    unknown[node.qualified_op] += 1
                continue
            chosen = []
            for e in eligible:  # loops, not all(): this runs for every slot of every node
                for i in e[1]:
                    if values[inputs[i]].elem_type != FLOAT:
                        break
                else:
                    for i in e[2]:
                        if values[outputs[i]].elem_type != FLOAT:
                            break
                    else:
                        chosen.append(e)
            chosen = eligible if len(chosen) == len(eligible) else tuple(chosen)
            if not chosen or (op in RETYPED_BY_ATTRIBUTE and not any(e[2] for e in chosen)):
                continue  # nothing to convert, or an attribute fixes a non-float output type
            found = shared.get(chosen)
            if found is None:
                found = shared[chosen] = Slots(frozenset(i for e in chosen for i in e[1]),
                                               frozenset(i for e in chosen for i in e[2]),
                                               frozenset(e[0] for e in chosen))
            slots[node.id] = found


_MISSING = object()
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
