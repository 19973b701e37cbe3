"""KeepTruncatedValues: a float value that becomes an integer is computed in float32."""

from __future__ import annotations

from onnx import TensorProto

from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.passes.base import Pass, PassResult

INTEGER_TYPES = frozenset({TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                           TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})
ROUNDING = frozenset({"Floor", "Ceil", "Round"})
"""Float ops that make integers out of floats; a Cast to an integer type after them truncates."""
PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"})
"""Data movement between the value and its truncation: the value is still the same numbers."""


class KeepTruncatedValues(Pass[Analysis]):
    """Invariant: the input of every Cast to an integer type, and every Floor, Ceil or Round
    and data movement between it and the node that computes the value, are float32, and so is
    that node (safety priority: only the user overrides it). Float16 rounding of the value
    would change the integer it becomes (an index computed as ``Mul -> Cast(int64)`` is off by
    one once the product rounds past a whole number).
    """

    def run(self, analysis: Analysis) -> PassResult:
        index, coloring = analysis.index, analysis.coloring
        before = coloring.changes
        for node in index.nodes:
            if node.cast_to not in INTEGER_TYPES or not node.inputs or node.inputs[0] is None:
                continue
            reason = f"its value is truncated to an integer by Cast {node.label!r}; float16 rounding would change it"
            chain, value = [node], index.values[node.inputs[0]]
            while (producer := index.producer_node(value)) is not None:
                chain.append(producer)
                if producer.domain != "" or producer.op_type not in ROUNDING | PASS_THROUGH or not producer.inputs \
                        or producer.inputs[0] is None:
                    break  # the node that computes the value
                value = index.values[producer.inputs[0]]
            for member in chain:
                if member.id in coloring.decisions:
                    coloring.fix(member.id, Color.FP32, reason, Priority.SAFETY)
        return PassResult(coloring.changes != before)
