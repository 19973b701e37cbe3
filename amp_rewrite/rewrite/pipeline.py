"""The numbered pipeline: the model's own functions are inlined, analysis passes color it,
then ``InsertCasts`` edits it, ``SeparateNormCasts`` keeps ONNX Runtime's LayerNorm fusion
from breaking the result, and ``DeclareInferredShapes`` declares the shapes the analysis inferred.

0. InlineFunctions, UpgradeOpset  1. InferTypes  2. FindCandidates  3. ColorByPolicy  4. KeepUnfitConstants
5. KeepTruncatedValues  6. KeepQuantizedUnits  7. MeasureRanges  8. PropagateDeny  9. KeepRmsEpsilons
10. ChooseMinCasts  11. InsertCasts  12. SeparateNormCasts  13. DeclareInferredShapes

Each stage is a sequence of passes on one context (``passes.base``): ``model_passes`` on the model
before it is indexed, ``analysis_passes`` on the ``Analysis``, ``rewrite_passes`` on the ``Rewrite``;
``run_passes`` runs one and times each pass under its name in ``Analysis.seconds``.

The pipeline runs no model and holds no running measurement: the range check judges the
``measuring.Ranges`` its caller hands it (tables, and calls that return them), and the caller
(``workflows``, ``training``) starts the measurement beside the analysis, on the model ``prepare``
made, and stops it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

import onnx

from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.memory import release_free_memory
from amp_rewrite.ir.sizes import inferred_types, lacks_shapes
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.measuring import Ranges
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.passes import (
    ChooseMinCasts,
    ColorByPolicy,
    DeclareInferredShapes,
    FindCandidates,
    InferTypes,
    InlineFunctions,
    InsertCasts,
    KeepQuantizedUnits,
    KeepResidualStream,
    KeepRmsEpsilons,
    KeepTruncatedValues,
    KeepUnfitConstants,
    MeasureRanges,
    Pass,
    PassResult,
    PropagateDeny,
    Rewrite,
    RewriteStats,
    SeparateNormCasts,
    UpgradeOpset,
)

Context = TypeVar("Context")


def model_passes(options: ConvertOptions) -> tuple[InlineFunctions, UpgradeOpset]:
    """Step 0, on the model itself (``options`` validated)."""
    return InlineFunctions(), UpgradeOpset(options.output, options.coloring.precision)


def analysis_passes(options: ConvertOptions) -> tuple[Pass[Analysis], ...]:
    """Steps 1 to 10, on the analysis, each given its part of ``options`` (validated)."""
    return (InferTypes(), FindCandidates(), ColorByPolicy(options.coloring), KeepResidualStream(options.coloring),
            KeepUnfitConstants(options.measurement),
            KeepTruncatedValues(), KeepQuantizedUnits(), MeasureRanges(options.measurement), PropagateDeny(),
            KeepRmsEpsilons(), ChooseMinCasts())


def rewrite_passes(defer: bool = False) -> tuple[Pass[Rewrite], ...]:
    """Steps 11 to 13, which edit the model (``defer``: as ``InsertCasts`` takes it)."""
    return InsertCasts(defer), SeparateNormCasts(), DeclareInferredShapes()


def run_passes(passes: Iterable[Pass[Context]], context: Context, seconds: dict[str, float]) -> PassResult:
    """Run ``passes`` on ``context`` in order, adding each one's seconds to ``seconds`` under its
    name; what they did together (changed where any changed; their notes in order)."""
    changed = False
    notes: list[str] = []
    for step in passes:
        started = time.perf_counter()
        result = step.run(context)
        seconds[step.name] = seconds.get(step.name, 0.0) + time.perf_counter() - started
        changed = changed or result.changed
        notes.extend(result.notes)
    return PassResult(changed, tuple(notes))


def prepare(model: onnx.ModelProto, options: ConvertOptions, seconds: dict[str, float],
            copy: bool = False) -> tuple[onnx.ModelProto, PassResult]:
    """``model`` as the analysis takes it (step 0: functions inlined, an opset ONNX Runtime lacks
    upgraded), in place, or where ``copy``, in a copy made only where a pass applies; what the
    passes did. A range check's measurement is of this model: its value keys are the analysis's."""
    inline, upgrade = model_passes(options)
    if copy:
        if not (model.functions or upgrade.needed(model)):
            return model, PassResult(False)
        model = onnx.ModelProto.FromString(model.SerializeToString())
    return model, run_passes((inline, upgrade), model, seconds)


def analyze(model: onnx.ModelProto, options: ConvertOptions | None = None,
            base_dir: str | os.PathLike | None = None, ranges: Ranges | None = None, *,
            prepared: PassResult | None = None, seconds: dict[str, float] | None = None) -> Analysis:
    """Color ``model`` without editing it: the coloring, each decision's reason, and notes.
    ``ranges``: what the range check judges (``measuring.Ranges``; without them a range check that
    runs finds nothing to measure with). ``prepared``: what ``prepare`` did to ``model`` (None: a
    model that defines functions or needs upgrading is prepared here, in a copy). ``seconds``: the
    caller's steps timed so far, the analysis's added."""
    options = (options or ConvertOptions()).validated()
    seconds = {} if seconds is None else seconds
    if prepared is None:
        model, prepared = prepare(model, options, seconds, copy=True)
    with gc_paused():
        started = time.perf_counter()
        # Shapes the model lacks are inferred before the index exists, and the inference's
        # memory is handed back before the index is built: inferred after it, their memory
        # would add to the index's at the conversion's peak. (Inferred in a child process
        # beside the analysis, they would cost more memory and save no time.)
        inferred = inferred_types(model) if lacks_shapes(model) else None
        release_free_memory()
        inferred_at = time.perf_counter()
        analysis = Analysis(ModelIndex(model), options, base_dir, ranges=ranges or Ranges(), inferred=inferred,
                            seconds=seconds)
        analysis.seconds["ShapeInference"] = inferred_at - started
        analysis.seconds["ModelIndex"] = time.perf_counter() - inferred_at
        analysis.notes.extend(run_passes(analysis_passes(options), analysis, analysis.seconds).notes)
    analysis.notes.extend(note for note in prepared.notes if note not in analysis.notes)
    return analysis


def rewrite(proto: onnx.ModelProto, options: ConvertOptions, base_dir: str | None, defer: bool = False,
            ranges: Ranges | None = None, *, prepared: PassResult | None = None,
            seconds: dict[str, float] | None = None) -> tuple[Analysis, RewriteStats]:
    """Color ``proto`` and insert its casts, in place. ``defer``: leave the conversion of
    top-level initializers to ``io.save`` (see ``InsertCasts``); ``ranges``, ``seconds``: as
    ``analyze`` takes them; ``prepared``: what ``prepare`` did to ``proto`` (None: prepared here)."""
    options = options.validated()
    seconds = {} if seconds is None else seconds
    with gc_paused():
        if prepared is None:
            _, prepared = prepare(proto, options, seconds)
        analysis = analyze(proto, options, base_dir, ranges, prepared=prepared, seconds=seconds)
        release_free_memory()
        edits = Rewrite(analysis)
        analysis.notes.extend(run_passes(rewrite_passes(defer), edits, analysis.seconds).notes)
        return analysis, edits.stats


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: reference counting still frees what is
    not in a cycle, and cycles wait until it resumes. The index and the analysis allocate
    a few objects per node and value, none in cycles; with the collector on, it would walk
    this growing heap again and again, each walk longer than the last, and find nothing to free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
