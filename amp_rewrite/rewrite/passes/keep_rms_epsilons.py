"""KeepRmsEpsilons: a written-out RMSNorm adds its epsilon in float32 where ONNX Runtime would lose it."""

from __future__ import annotations

import numpy as np

from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.norms import mean_square_of, scalar
from amp_rewrite.rewrite.passes.base import Pass, PassResult

FUSED_EPSILON = 1e-5
"""The epsilon ONNX Runtime's SimplifiedLayerNormFusion gives a float16 RMSNorm whose epsilon
constant it cannot read (1.31: once ConstantSharing has merged the model's equal epsilons)."""


class KeepRmsEpsilons(Pass[Analysis]):
    """Invariant: no candidate Add that adds a constant epsilon to the mean of a square
    (``Pow(x, 2)`` or ``Mul(x, x)``) of an ``x`` that is not mean-centred, which is a written-out
    RMSNorm (Llama, T5, Qwen2, Gemma), runs low when its epsilon differs in the low type from
    FUSED_EPSILON (safety priority). ONNX Runtime 1.31 fuses such a low-precision RMSNorm with
    epsilon 1e-5 once two of them share the constant (every layer has the same one): a model
    with 1e-6 then deviates from its float32 result wherever the variance is small. With the Add
    float32 the pattern is not fused, and the casts it costs are on the reduced ``[..., 1]``
    tensors. A mean-centred square is a LayerNorm, whose fusion reads its epsilon right. It runs
    after PropagateDeny: by default the variance's ReduceMean is deny and the Add float32
    already; this pass acts where the Add would still run low (the all-low policy, the user's
    overrides).
    """

    def run(self, analysis: Analysis) -> PassResult:
        index, coloring = analysis.index, analysis.coloring
        before = coloring.changes
        fused = np.asarray(FUSED_EPSILON, analysis.precision.numpy_type)
        for node_id, decision in coloring.decisions.items():
            if decision.color is Color.FP32:
                continue
            node = index.nodes[node_id]
            if node.op_type != "Add" or node.domain != "" or len(node.inputs) != 2:
                continue
            for epsilon_at in (0, 1):
                if mean_square_of(analysis, node.inputs[1 - epsilon_at]) is None:  # the cheaper test first
                    continue
                epsilon = scalar(analysis, node.inputs[epsilon_at])
                if epsilon is None:
                    continue
                if np.asarray(epsilon, analysis.precision.numpy_type) != fused:
                    coloring.fix(node_id, Color.FP32, f"the epsilon {epsilon:g} of a written-out RMSNorm: ONNX "
                                 f"Runtime fuses a {analysis.precision.value} RMSNorm with epsilon {FUSED_EPSILON:g} "
                                 "once its epsilons are shared", Priority.SAFETY)
                break
        return PassResult(coloring.changes != before)
