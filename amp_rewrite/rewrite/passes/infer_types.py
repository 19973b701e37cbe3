"""InferTypes: give every value the element type its producer's schema implies."""

from __future__ import annotations

from amp_rewrite.ir.types import infer_types
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.passes.base import Pass, PassResult


class InferTypes(Pass[Analysis]):
    """Invariant: a value lacking an element type gets one when its producer's schema,
    attributes or subgraph declare it (see ``ir.types.infer_types``).
    """

    def run(self, analysis: Analysis) -> PassResult:
        return PassResult(infer_types(analysis.index) > 0)
