"""``analyze``: the pipeline's analysis (``rewrite.pipeline``), its range check measured by ONNX
Runtime (``runtime.ranges``) beside it: the rewrite layer judges measurements and runs nothing.
``range_check`` is how the workflows hand the pipeline its measurements."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import onnx

from amp_rewrite.rewrite import pipeline
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.measuring import Ranges
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.passes import MeasureRanges
from amp_rewrite.runtime import ranges


def analyze(model: onnx.ModelProto, options: ConvertOptions | None = None,
            base_dir: str | os.PathLike | None = None, measured: dict | None = None) -> Analysis:
    """``pipeline.analyze``, measuring with ONNX Runtime: color ``model`` without editing it (the
    coloring, each decision's reason, and notes). ``measured``: value statistics from an earlier
    run, used instead of running the model."""
    options = (options or ConvertOptions()).validated()
    seconds: dict[str, float] = {}
    model, prepared = pipeline.prepare(model, options, seconds, copy=True)
    with range_check(model, options, base_dir, measured) as (found, _):
        return pipeline.analyze(model, options, base_dir, found, prepared=prepared, seconds=seconds)


@contextlib.contextmanager
def range_check(model: onnx.ModelProto, options: ConvertOptions, base_dir: str | os.PathLike | None,
                measured: dict | None = None,
                defer: bool = False) -> Iterator[tuple[Ranges, ranges.Measurement | None]]:
    """The ``Ranges`` the pipeline judges for ``model`` (as ``pipeline.prepare`` made it), and the
    measurement of its every float value running beside the block (where ``measured`` is not given
    and the range check runs on the model), which the block may wait for (``defer``: the caller
    settles the range check with it, ``MeasureRanges.settle``); stopped at the block's end."""
    meter = ranges.Meter.of(options.measurement, base_dir)
    wanted = measured is None and not MeasureRanges(options.measurement).skip_reason(model)
    with meter.beside(model, wanted) as every:
        yield Ranges(measured, every.result if every else None, meter.measure, defer and every is not None), every
