"""PropagateDeny: values leaving a deny op stay float32 until the next allow op."""

from __future__ import annotations

from amp_rewrite.policy.oplists import CLEAR, DENY, INFER
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color, Priority
from amp_rewrite.rewrite.norms import layer_norms_end_regions, normalizes
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class PropagateDeny(Pass[Analysis]):
    """Invariant: every free infer or clear node that reads, through a chain of infer
    and clear nodes, an output of a float32 deny node, or of a node that reads a
    constant float16 cannot hold (such as an attention mask of -3.4e38), is fixed
    float32 (as TensorFlow's AutoMixedPrecision does for deny ops), so results that
    need float32 are not rounded or overflowed on their way to the next allow op.
    The chain ends at a node that divides a value by its own RMS (``norms.normalizes``, a
    written-out RMSNorm's scaling): that node is float32, but its output is at most the square
    root of the reduced extent in magnitude whatever the input, so its readers stay free. A
    float32 RMSNorm can then read a float16 stream through one Cast and write float16 through
    another (where ChooseMinCasts finds that no dearer) rather than keep the stream float32;
    on CUDA, ONNX Runtime fuses the norm and both Casts into one SimplifiedLayerNormalization
    computing in float32 (``benchmarks/norm_fusion.py``: where the scaling is a Div or a Mul of
    Div(1, _); it fuses no Reciprocal form, in float32 either).
    A written-out LayerNorm's scaling of the centred ``d = x - mean(x)`` by its RMS is bounded
    alike, but its float16 ``x`` loses ``|x| * 2^-11`` before the centring: the chain ends there
    only where the policy runs LayerNormalization itself in low precision (on CUDA, whose
    kernel computes the statistics of a float16 input in float32), since that is the rounding
    such a kernel takes too. ONNX Runtime then fuses the norm, its Casts, weight and bias into
    one float16 LayerNormalization (``SeparateNormCasts`` keeps the fusion's types consistent).
    """

    def run(self, analysis: Analysis) -> PassResult:
        coloring, index = analysis.coloring, analysis.index
        before = coloring.changes
        centred = layer_norms_end_regions(analysis)
        roots = [n for n, d in coloring.decisions.items()
                 if d.color is Color.FP32 and (d.op_class == DENY or n in analysis.unfit_readers)]
        for root in roots:
            source = index.nodes[root]
            why = "deny node" if coloring.decisions[root].op_class == DENY else "unfit-constant reader"
            reason = f"downstream of {why} {source.label!r} ({source.op_type}); float32 until the next allow op"
            stack = [root]
            while stack:
                node_id = stack.pop()
                for _, _, value in (s for s in analysis.slot_values(node_id) if not s[0]):
                    for consumer, _ in analysis.slot_readers(value):
                        decision = coloring.decisions[consumer]
                        if decision.free and decision.op_class in (INFER, CLEAR):
                            coloring.fix(consumer, Color.FP32, reason, Priority.POLICY)
                            if not normalizes(analysis, index.nodes[consumer], centred):
                                stack.append(consumer)
        return PassResult(coloring.changes != before)
