"""PropagateDeny: values leaving a deny op stay float32 until the next allow op."""

from __future__ import annotations

from ..analysis import Analysis
from ..coloring import Color, Priority
from ..oplists import CLEAR, DENY, INFER


class PropagateDeny:
    """Invariant: every free infer or clear node that reads, through a chain of infer
    and clear nodes, an output of a float32 deny node is fixed float32 (as TensorFlow's
    AutoMixedPrecision does), so fp32-sensitive results are not rounded on their way
    to the next allow op.
    """

    def run(self, analysis: Analysis) -> None:
        coloring, index = analysis.coloring, analysis.index
        roots = [n for n, d in coloring.decisions.items() if d.op_class == DENY and d.color is Color.FP32]
        for root in roots:
            source = index.nodes[root]
            reason = f"downstream of deny node {source.label!r} ({source.op_type}); float32 until the next allow op"
            stack = [root]
            while stack:
                node_id = stack.pop()
                for _, _, value in (s for s in analysis.slot_values(node_id) if not s[0]):
                    for consumer, i in value.uses:
                        decision = coloring.decisions.get(consumer)
                        if (decision is not None and decision.free and decision.op_class in (INFER, CLEAR)
                                and i in analysis.slots[consumer].inputs):
                            coloring.fix(consumer, Color.FP32, reason, Priority.POLICY)
                            stack.append(consumer)
