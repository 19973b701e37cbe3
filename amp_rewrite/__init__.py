"""amp-rewrite: rewrite ONNX models to mixed precision (float16 or bfloat16 with float32 where needed).

Layers, each importing only those beneath it: ``ir`` (the model as data), ``policy``
(op classes and kernel tables), ``runtime`` (sessions, instrumented runs, emulation,
samples), ``numerics`` (compare, check, localize), ``rewrite`` (the mixed-precision
passes and their pipeline) beside ``autodiff`` (gradient rules and the backward pass,
on ``ir`` alone), ``training`` (losses, loss scaling, optimizers, the step graph, the
trainer), ``workflows`` (convert with validation, check with explanations, bench, train and
the training step) and ``cli``. The training step's parts live in :mod:`amp_rewrite.training`.
"""

import importlib

from amp_rewrite.errors import UserError

__version__ = "0.1.0"
_PUBLIC = {"Precision": "ir.precision", "CheckResult": "numerics.check", "Tolerance": "numerics.compare",
           "Analysis": "rewrite.analysis", "Color": "rewrite.coloring", "ConvertOptions": "rewrite.options",
           "analyze": "workflows.analyze", "Report": "rewrite.report", "BenchResult": "workflows.bench",
           "bench": "workflows.bench", "check": "workflows.check", "convert": "workflows.convert",
           "train": "workflows.train", "training_step": "workflows.train", "TrainReport": "workflows.train",
           "StepOptions": "training.options", "FitOptions": "training.runner.options"}
"""Where each public name lives: imported when first asked for, so that a command pays only
for the layers it uses (importing all of them would slow every command's start-up)."""
__all__ = ["Analysis", "BenchResult", "CheckResult", "Color", "ConvertOptions", "FitOptions", "Precision", "Report",
           "StepOptions", "Tolerance", "TrainReport", "UserError", "analyze", "bench", "check", "convert", "train",
           "training_step"]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'amp_rewrite' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"amp_rewrite.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
