"""``analyze``: the pipeline's analysis (``rewrite.pipeline``), its range check measured by ONNX
Runtime (``runtime.ranges``): the rewrite layer judges measurements and runs nothing."""

from __future__ import annotations

import os

import onnx

from amp_rewrite.rewrite import pipeline
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.measuring import Measurement
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.runtime import ranges


def analyze(model: onnx.ModelProto, options: ConvertOptions | None = None,
            base_dir: str | os.PathLike | None = None, measured: dict | None = None, *,
            measuring: Measurement | None = None, speculate: bool = False) -> Analysis:
    """``pipeline.analyze``, measuring with ONNX Runtime: color ``model`` without editing it (the
    coloring, each decision's reason, and notes). ``measured``: value statistics from an earlier
    run, used instead of running the model; ``measuring``, ``speculate``: as the pipeline takes them."""
    options = (options or ConvertOptions()).validated()
    return pipeline.analyze(model, options, base_dir, measured, measuring=measuring, speculate=speculate,
                            meter=ranges.Meter.of(options.measurement, base_dir))
