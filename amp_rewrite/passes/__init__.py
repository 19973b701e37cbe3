"""The graph passes, one per module, in the order ``convert`` runs them.

Analysis passes refine a coloring and edit nothing; ``InsertCasts`` is the one
pass that changes the model.
"""

from .choose_min_casts import ChooseMinCasts
from .color_by_policy import ColorByPolicy
from .find_candidates import FindCandidates
from .infer_types import InferTypes
from .insert_casts import InsertCasts
from .keep_unfit_constants import KeepUnfitConstants
from .measure_ranges import MeasureRanges
from .propagate_deny import PropagateDeny

ANALYSIS = (InferTypes, FindCandidates, ColorByPolicy, KeepUnfitConstants, MeasureRanges, PropagateDeny,
            ChooseMinCasts)

__all__ = ["ANALYSIS", "ChooseMinCasts", "ColorByPolicy", "FindCandidates", "InferTypes", "InsertCasts",
           "KeepUnfitConstants", "MeasureRanges", "PropagateDeny"]
