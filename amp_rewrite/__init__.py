"""amp-rewrite: rewrite ONNX models to mixed precision (float16 or bfloat16 with float32 where needed).

Layers, each importing only those beneath it: ``ir`` (the model as data), ``policy``
(op classes and kernel tables), ``runtime`` (sessions, instrumented runs, emulation,
samples), ``numerics`` (compare, check, localize), ``rewrite`` (the mixed-precision
passes and their pipeline) beside ``autodiff`` (gradient rules and the backward pass,
on ``ir`` alone), ``training`` (losses, loss scaling, optimizers, the step graph, the
trainer), ``workflows`` (convert with validation, check with explanations, bench) and ``cli``.
Training lives in :mod:`amp_rewrite.training`.
"""

from amp_rewrite.errors import UserError
from amp_rewrite.ir.precision import Precision
from amp_rewrite.numerics.check import CheckResult
from amp_rewrite.numerics.compare import Tolerance
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.pipeline import analyze
from amp_rewrite.rewrite.report import Report
from amp_rewrite.workflows.bench import BenchResult, bench
from amp_rewrite.workflows.check import check
from amp_rewrite.workflows.convert import convert

__version__ = "0.1.0"
__all__ = ["Analysis", "BenchResult", "CheckResult", "Color", "ConvertOptions", "Precision", "Report", "Tolerance",
           "UserError", "analyze", "bench", "check", "convert"]
