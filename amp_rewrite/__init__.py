"""amp-rewrite: rewrite ONNX models to mixed precision (float16 or bfloat16 with float32 where needed)."""

from .analysis import Analysis
from .coloring import Color
from .convert import analyze, convert
from .errors import UserError
from .options import ConvertOptions
from .precision import Precision
from .report import Report

__version__ = "0.1.0"
__all__ = ["Analysis", "Color", "ConvertOptions", "Precision", "Report", "UserError", "analyze", "convert"]
