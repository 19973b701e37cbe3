"""KeepUnfitConstants: constants whose values don't fit the target keep their readers in float32."""

from __future__ import annotations

import onnx

from amp_rewrite.ir.graph import INITIALIZER, Value
from amp_rewrite.ir.tensors import constant_tensor, judge_fit, judge_tensors, read_array
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.options import MeasurementOptions
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class KeepUnfitConstants(Pass[Analysis]):
    """Invariant: no candidate reads, in a convertible slot, an initializer or Constant
    whose values exceed the target's range or mostly flush to zero there, nor where a zero
    gives inf or NaN (``ZERO_SINGULAR_INPUTS``: a divisor, log's input) one of whose nonzero
    values flushes to zero there, unless the user forced it; a ConstantOfShape whose fill
    value doesn't fit stays float32. Such values are kept, never clamped. ``underflow_share``
    (of ``options``) is the share of a constant's L2 norm that may flush to zero.
    """

    def __init__(self, options: MeasurementOptions) -> None:
        self.underflow_share = options.underflow_share

    def run(self, analysis: Analysis) -> PassResult:
        index = analysis.index
        before = analysis.coloring.changes
        pending: list[tuple[Value, list[tuple[int, int]], onnx.TensorProto]] = []
        decisions = analysis.coloring.decisions
        for value in index.all_values():
            if not analysis.is_float(value) or not analysis.is_offline(value):
                continue
            readers = [(n, i) for n, i in analysis.slot_readers(value) if decisions[n].color is not Color.FP32]
            if not readers:
                continue
            tensor = analysis.constant_of(value)
            if tensor is None:  # a Constant of no dense tensor (its sparse_value): neither judged nor converted
                _keep(analysis, value, readers, "no dense tensor (a sparse_value)")
            else:
                pending.append((value, readers, tensor))
        tensors = (tensor for _, _, tensor in pending)
        for (value, readers, _), fit in zip(pending, judge_tensors(tensors, analysis.base_dir, analysis.precision,
                                                                   self.underflow_share)):
            problem = fit.problem
            if problem is None and fit.lost_share:
                readers = [(n, i) for n, i in readers if analysis.zero_singular(n, i)]
                problem = f"values that flush to zero in {analysis.precision.value}, where a zero gives inf or NaN"
            if problem is None or not readers:
                continue
            _keep(analysis, value, readers, problem)
        for node_id in analysis.slots:
            node = index.nodes[node_id]
            if node.op_type == "ConstantOfShape" and node.domain == "":
                fill = constant_tensor(node.proto)
                filled = (judge_fit(read_array(fill, None), analysis.precision, self.underflow_share)
                          if fill else None)
                if filled is not None and filled.problem and analysis.coloring.fix(
                        node_id, Color.FP32, f"fill value has {filled.problem}", Priority.SAFETY):
                    analysis.unfit_readers.add(node_id)
        return PassResult(analysis.coloring.changes != before)


def _keep(analysis: Analysis, value: Value, readers: list[tuple[int, int]], problem: str) -> None:
    """The readers of the constant ``value`` float32 (SAFETY), for ``problem``."""
    kind = "initializer" if value.source == INITIALIZER else "Constant"
    analysis.kept_constants[value.name] = problem
    for node_id, _ in readers:
        if analysis.coloring.fix(node_id, Color.FP32, f"reads {kind} {value.name!r} with {problem}", Priority.SAFETY):
            analysis.unfit_readers.add(node_id)
