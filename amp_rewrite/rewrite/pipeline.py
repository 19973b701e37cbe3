"""The numbered pipeline: the model's own functions are inlined, analysis passes color it,
then ``InsertCasts`` edits it, ``SeparateNormCasts`` keeps ONNX Runtime's LayerNorm fusion
from breaking the result, and ``DeclareInferredShapes`` declares the shapes the analysis inferred.

0. InlineFunctions, UpgradeOpset  1. InferTypes  2. FindCandidates  3. ColorByPolicy  4. KeepUnfitConstants
5. KeepTruncatedValues  6. KeepQuantizedUnits  7. MeasureRanges  8. PropagateDeny  9. KeepRmsEpsilons
10. ChooseMinCasts  11. InsertCasts  12. SeparateNormCasts  13. DeclareInferredShapes
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Iterator

import onnx

from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import inferred_types, lacks_shapes
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.passes import (
    ANALYSIS,
    DeclareInferredShapes,
    InlineFunctions,
    InsertCasts,
    MeasureRanges,
    SeparateNormCasts,
    UpgradeOpset,
)
from amp_rewrite.rewrite.passes.insert_casts import RewriteStats
from amp_rewrite.runtime import ranges
from amp_rewrite.runtime.isolate import release_free_memory
from amp_rewrite.runtime.ranges import Measurement


def analyze(model: onnx.ModelProto, options: ConvertOptions | None = None,
            base_dir: str | os.PathLike | None = None, measured: dict | None = None, *,
            measuring: Measurement | None = None, speculate: bool = False) -> Analysis:
    """Color ``model`` without editing it: the coloring, each decision's reason, and notes.
    ``measured``: value statistics from an earlier run, used instead of running the model.
    ``measuring``: the range check's measurement from an earlier analysis of the same model
    (else one starts here, beside the analysis). ``speculate``: the range check may leave its
    values ``pending`` for ``MeasureRanges.settle`` (the caller converts on meanwhile). A model
    that defines functions is analyzed with them inlined (in a copy), as ``rewrite`` converts it."""
    options = (options or ConvertOptions()).validated()
    inlined = upgraded = None
    if model.functions or UpgradeOpset.needed(model, options):
        model = onnx.ModelProto.FromString(model.SerializeToString())
        inlined = InlineFunctions().run(model)
        upgraded = UpgradeOpset().run(model, options)
    if measuring is None and measured is None:
        measuring = start_measuring(model, options, base_dir)
    try:
        with gc_paused():
            started = time.perf_counter()
            # Shapes the model lacks are inferred before the index exists, and the inference's
            # memory is handed back before the index is built: inferred after it, on a 50k-node
            # model, they peaked at 100 MB above the index (the conversion's peak). (Inferred in
            # a child process beside the analysis, they cost 70 MB more PSS and saved no time.)
            inferred = inferred_types(model) if lacks_shapes(model) else None
            release_free_memory()
            inferred_at = time.perf_counter()
            analysis = Analysis(ModelIndex(model), options, base_dir, measured=measured, measuring=measuring,
                                remeasure=functools.partial(ranges.measure, model, _range_source(options), base_dir),
                                speculate=speculate, inferred=inferred)
            analysis.seconds["ShapeInference"] = inferred_at - started
            analysis.seconds["ModelIndex"] = time.perf_counter() - inferred_at
            for step in ANALYSIS:
                started = time.perf_counter()
                step().run(analysis)
                analysis.seconds[step.__name__] = time.perf_counter() - started
    except BaseException:
        if measuring is not None:
            measuring.close()
        raise
    if measuring is not None and analysis.pending is None:  # collected, or nothing could change precision
        measuring.close()
    analysis.notes.extend(note for note in (inlined, upgraded) if note)
    return analysis


def start_measuring(model: onnx.ModelProto, options: ConvertOptions, base_dir) -> Measurement | None:
    """The range check's measurement of every float value of ``model``, started beside the
    analysis (None where the options rule the range check out, or no child can be had)."""
    if MeasureRanges.skip_reason(model, options):
        return None
    return ranges.start(model, _range_source(options), base_dir)


def _range_source(options: ConvertOptions) -> ranges.Source:
    return ranges.Source(options.calibrate or options.inputs, options.shapes, options.seed,
                         Precision(options.precision))


def rewrite(proto: onnx.ModelProto, options: ConvertOptions, base_dir: str | None,
            measured: dict | None = None, defer: bool = False, *, measuring: Measurement | None = None,
            speculate: bool = False) -> tuple[Analysis, RewriteStats]:
    """Color ``proto`` and insert its casts, in place. ``defer``: leave the conversion of
    top-level initializers to ``io.save`` (see ``InsertCasts``); ``measuring``, ``speculate``:
    as ``analyze`` takes them."""
    with gc_paused():
        inlined = InlineFunctions().run(proto)
        upgraded = UpgradeOpset().run(proto, options.validated())
        analysis = analyze(proto, options, base_dir, measured, measuring=measuring, speculate=speculate)
        analysis.notes.extend(note for note in (inlined, upgraded) if note and note not in analysis.notes)
        release_free_memory()
        started = time.perf_counter()
        stats = InsertCasts(defer).run(analysis)
        SeparateNormCasts().run(analysis, stats)
        analysis.seconds[InsertCasts.__name__] = time.perf_counter() - started
        started = time.perf_counter()
        DeclareInferredShapes().run(analysis, stats.retyped)
        analysis.seconds[DeclareInferredShapes.__name__] = time.perf_counter() - started
        return analysis, stats


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: reference counting still frees what is
    not in a cycle, and cycles wait until it resumes. The index and the analysis allocate
    a few objects per node and value, none in cycles; with the collector on, each of its
    passes over this growing heap costs more (a quarter of a 50k-node model's conversion)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
