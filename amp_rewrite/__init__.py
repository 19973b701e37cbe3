"""amp-rewrite: rewrite ONNX models to mixed precision (float16 or bfloat16 with float32 where needed)."""

from .analysis import Analysis
from .check import CheckResult, check
from .coloring import Color
from .compare import Tolerance
from .convert import analyze, convert
from .errors import UserError
from .options import ConvertOptions
from .precision import Precision
from .report import Report

__version__ = "0.1.0"
__all__ = ["Analysis", "CheckResult", "Color", "ConvertOptions", "Precision", "Report", "Tolerance", "UserError",
           "analyze", "check", "convert"]
