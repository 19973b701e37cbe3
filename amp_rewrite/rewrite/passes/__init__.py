"""The graph passes, one per module, in the order ``convert`` runs them.

``InlineFunctions`` first replaces calls of the model's own functions by their bodies, and
``UpgradeOpset`` raises the model's opset where the target precision or the user needs it;
analysis passes refine a coloring and edit nothing; ``InsertCasts`` changes the model,
``SeparateNormCasts`` mends what it made for ONNX Runtime's LayerNorm fusion, and
``DeclareInferredShapes`` writes the shapes the analysis inferred into it. Each is a ``Pass``
(``base.py``): its invariant in its docstring, its settings in its constructor, ``run(context)``
returning a ``PassResult``; ``pipeline.py`` holds their order.
"""

from amp_rewrite.rewrite.passes.base import Pass, PassResult
from amp_rewrite.rewrite.passes.choose_min_casts import ChooseMinCasts
from amp_rewrite.rewrite.passes.color_by_policy import ColorByPolicy
from amp_rewrite.rewrite.passes.declare_inferred_shapes import DeclareInferredShapes
from amp_rewrite.rewrite.passes.find_candidates import FindCandidates
from amp_rewrite.rewrite.passes.infer_types import InferTypes
from amp_rewrite.rewrite.passes.inline_functions import InlineFunctions
from amp_rewrite.rewrite.passes.insert_casts import InsertCasts, Rewrite, RewriteStats
from amp_rewrite.rewrite.passes.keep_quantized_units import KeepQuantizedUnits
from amp_rewrite.rewrite.passes.keep_residual_stream import KeepResidualStream
from amp_rewrite.rewrite.passes.keep_rms_epsilons import KeepRmsEpsilons
from amp_rewrite.rewrite.passes.keep_truncated_values import KeepTruncatedValues
from amp_rewrite.rewrite.passes.keep_unfit_constants import KeepUnfitConstants
from amp_rewrite.rewrite.passes.measure_ranges import MeasureRanges
from amp_rewrite.rewrite.passes.propagate_deny import PropagateDeny
from amp_rewrite.rewrite.passes.separate_norm_casts import SeparateNormCasts
from amp_rewrite.rewrite.passes.upgrade_opset import UpgradeOpset

__all__ = ["ChooseMinCasts", "ColorByPolicy", "DeclareInferredShapes", "FindCandidates", "InferTypes",
           "InlineFunctions", "InsertCasts", "KeepQuantizedUnits", "KeepResidualStream", "KeepRmsEpsilons",
           "KeepTruncatedValues", "KeepUnfitConstants", "MeasureRanges", "Pass", "PassResult", "PropagateDeny",
           "Rewrite", "RewriteStats", "SeparateNormCasts", "UpgradeOpset"]
