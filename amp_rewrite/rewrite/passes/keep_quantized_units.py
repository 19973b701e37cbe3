"""KeepQuantizedUnits: the op of a quantized node unit stays float32, between its quantizers."""

from __future__ import annotations

from amp_rewrite.ir.graph import Value
from amp_rewrite.policy.oplists import DEQUANTIZE, QUANTIZE, op_key
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class KeepQuantizedUnits(Pass[Analysis]):
    """Invariant: a candidate whose convertible inputs are all made by DequantizeLinear and whose
    convertible outputs are all read by QuantizeLinear alone (no graph output among them) is float32,
    and so are those DequantizeLinear and QuantizeLinear nodes (safety priority: only the user
    overrides it). Such a node is the float stand-in of an integer kernel in a quantized (QDQ)
    model: ONNX Runtime fuses DequantizeLinear -> MatMul -> QuantizeLinear into QLinearMatMul
    (TensorRT into an int8 layer), and a Cast anywhere between them would leave a float16 MatMul on
    dequantized values instead, slower and with other numerics. A dequantized value that low nodes
    read as well is cast for them after the DequantizeLinear.
    """

    def run(self, analysis: Analysis) -> PassResult:
        index, coloring = analysis.index, analysis.coloring
        before = coloring.changes
        readers = {n for dq in index.nodes if op_key(dq.domain, dq.op_type) in DEQUANTIZE
                   for key in dq.outputs if key is not None for n, _ in index.values[key].uses}
        for node_id in sorted(readers):
            decision = coloring.decisions.get(node_id)
            if decision is None or decision.color is Color.FP32:
                continue
            node = index.nodes[node_id]
            key = op_key(node.domain, node.op_type)
            if key in DEQUANTIZE or key in QUANTIZE:
                continue
            reads: list[Value] = []
            makes: list[Value] = []
            for is_input, _, value in analysis.slot_values(node_id):
                (reads if is_input else makes).append(value)
            if not (reads and makes and all(_dequantized(analysis, v) for v in reads)
                    and all(_quantized(analysis, v) for v in makes)):
                continue
            reason = (f"quantized node unit: {node.op_type} {node.label!r} reads DequantizeLinear and feeds "
                      f"QuantizeLinear, which runtimes fuse with it into one integer {node.op_type}")
            dequantizers = [producer[0] for v in reads if (producer := v.producer) is not None]  # (all of them)
            quantizers = [n for v in makes for n, _ in v.uses]
            for member in (node_id, *dequantizers, *quantizers):
                if member in coloring.decisions:
                    coloring.fix(member, Color.FP32, reason, Priority.SAFETY)
        return PassResult(coloring.changes != before)


def _dequantized(analysis: Analysis, value: Value) -> bool:
    producer = analysis.index.producer_node(value)
    return producer is not None and op_key(producer.domain, producer.op_type) in DEQUANTIZE


def _quantized(analysis: Analysis, value: Value) -> bool:
    nodes = analysis.index.nodes
    return (not value.output_of and bool(value.uses)
            and all(op_key(nodes[n].domain, nodes[n].op_type) in QUANTIZE for n, _ in value.uses))
