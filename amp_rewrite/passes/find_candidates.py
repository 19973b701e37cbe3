"""FindCandidates: find the nodes whose float32 tensors may change precision."""

from __future__ import annotations

from ..analysis import FLOAT, Analysis, Slots
from ..graph import Node
from ..oplists import CONTROL_FLOW, RETYPED_BY_ATTRIBUTE
from ..schemas import signature


class FindCandidates:
    """Invariant: ``analysis.slots`` holds exactly the nodes with at least one input or
    output bound to a schema type parameter that is float32 at every slot, admits the
    target type, binds an input (or an attribute fixes it), and is not kept float32 by
    the op lists. Ops with no schema that touch
    float32 tensors are counted in ``analysis.unknown_ops``; they keep their types.
    """

    def run(self, analysis: Analysis) -> None:
        index = analysis.index
        for node in index.nodes:
            if node.domain == "" and (node.op_type in CONTROL_FLOW or node.op_type == "Constant"):
                continue
            slots = self._slots(analysis, node)
            if slots is not None:
                analysis.slots[node.id] = slots

    def _slots(self, analysis: Analysis, node: Node) -> Slots | None:
        index = analysis.index
        sig = signature(node.domain, node.op_type, index.opset(node), len(node.inputs), len(node.outputs))
        if sig is None:
            if any(k is not None and index.values[k].elem_type == FLOAT for k in (*node.inputs, *node.outputs)):
                analysis.unknown_ops[f"{node.domain + '.' if node.domain else ''}{node.op_type}"] += 1
            return None
        bound: dict[str, list[tuple[bool, int]]] = {}
        types: dict[str, set] = {}
        for is_input, formals, keys in ((True, sig.inputs, node.inputs), (False, sig.outputs, node.outputs)):
            for i, (formal, key) in enumerate(zip(formals, keys)):
                if key is None or not sig.is_param(formal):
                    continue
                bound.setdefault(formal, []).append((is_input, i))
                types.setdefault(formal, set()).add(index.values[key].elem_type)
        target = analysis.precision.schema_type
        kept = analysis.policy.keep_fp32_params(node.op_type)
        retyped = node.op_type in RETYPED_BY_ATTRIBUTE and node.domain == ""
        params = frozenset(
            p for p, seen in types.items()
            if seen == {FLOAT} and target in sig.allowed[p] and p not in kept
            and (retyped or any(is_input for is_input, _ in bound[p]))  # else the op derives its type
        )
        inputs = frozenset(i for p in params for is_input, i in bound[p] if is_input)
        outputs = frozenset(i for p in params for is_input, i in bound[p] if not is_input)
        if retyped and not outputs:
            return None  # its output type comes from an attribute and is not float32
        if not params:
            return None
        return Slots(inputs, outputs, params)
