"""``convert``: load a model, run the rewrite pipeline (validated when asked), report, and save."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import onnx

from amp_rewrite.errors import UserError
from amp_rewrite.ir import io, ir_versions
from amp_rewrite.ir.tensors import close_data_file, data_file
from amp_rewrite.rewrite import pipeline
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.measuring import Ranges
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.passes.measure_ranges import MeasureRanges
from amp_rewrite.rewrite.pipeline import gc_paused
from amp_rewrite.rewrite.records import record
from amp_rewrite.rewrite.report import Report, build_report
from amp_rewrite.runtime import instrument, ranges
from amp_rewrite.workflows.analyze import range_check

if TYPE_CHECKING:
    import onnx_ir

PathLike = TypeVar("PathLike", str, os.PathLike)


@overload
def convert(model: onnx.ModelProto, output: None = None, options: ConvertOptions | None = None,
            **kwargs: Any) -> tuple[onnx.ModelProto, Report]: ...
@overload
def convert(model: onnx_ir.Model, output: None = None, options: ConvertOptions | None = None,
            **kwargs: Any) -> tuple[onnx_ir.Model, Report]: ...
@overload
def convert(model: PathLike, output: PathLike, options: ConvertOptions | None = None,
            **kwargs: Any) -> tuple[PathLike, Report]: ...


def convert(model, output=None, options=None, **kwargs):
    """Rewrite a float32 model to mixed precision.

    ``model`` is a path (then ``output`` is the path to write, and the path is
    returned), an ``onnx.ModelProto`` or an ``onnx_ir.Model`` (the same kind is
    returned; the argument is not modified). Options come as a
    :class:`ConvertOptions` or as its fields by keyword. Returns
    ``(result, report)``. Bad input raises :class:`UserError`.
    """
    if options is not None and kwargs:
        raise UserError("pass either options= or option keywords, not both")
    try:
        options = (options or ConvertOptions(**kwargs)).validated()
    except TypeError as exc:
        raise UserError(str(exc)) from None
    with gc_paused():
        return _convert(model, output, options)


def _convert(model, output, options: ConvertOptions):
    started = time.perf_counter()
    proto, base_dir, kind = _load(model, output)
    loaded = time.perf_counter()
    bytes_before = None if kind == "path" else proto.ByteSize()
    # listed now: the save points the tensors at the output's files
    inputs = _input_files(model, io.initializers(proto)) if kind == "path" else []
    validation = None
    with contextlib.ExitStack() as measuring:
        if options.validate:
            from amp_rewrite.workflows.validate import convert_validated  # its numerics: only when asked

            proto, analysis, stats, validation = convert_validated(proto, options, base_dir)
            found, every = Ranges(), None
        else:
            # A path's output is saved here: its initializers are converted as they are written,
            # and the range check's measurement is settled once they are.
            seconds: dict[str, float] = {}
            _, prepared = pipeline.prepare(proto, options, seconds)
            found, every = measuring.enter_context(range_check(proto, options, base_dir, defer=kind == "path"))
            analysis, stats = pipeline.rewrite(proto, options, base_dir, kind == "path", found, prepared=prepared,
                                               seconds=seconds)
            if every is not None and analysis.pending is None:  # judged, or nothing to judge: its child goes now
                every.close()
        record(proto, analysis.measured_fp32)
        _declare_ir_version(proto, analysis)
        saving = time.perf_counter()
        # seconds by step of a first conversion that the range check undid (the ignores below: typeshed's
        # Counter counts ints alone)
        spent: Counter[str] = Counter()
        if kind == "path":
            try:
                written = _save(proto, model, output, base_dir, stats, analysis, every)
                if written is None:  # the range check keeps nodes float32: convert again with its measurement
                    spent.update(analysis.seconds)
                    saved = time.perf_counter() - saving - analysis.seconds.get(_SETTLE, 0.0)
                    spent[_SAVE] += saved  # type: ignore[assignment]
                    reloading = time.perf_counter()
                    proto = io.load(model, borrow=io.EXTERNAL_THRESHOLD)
                    spent[_LOAD] += time.perf_counter() - reloading  # type: ignore[assignment]
                    analysis, stats = pipeline.rewrite(proto, options, base_dir, True, replace(found, defer=False))
                    record(proto, analysis.measured_fp32)
                    _declare_ir_version(proto, analysis)
                    saving = time.perf_counter()
                    written = _save(proto, model, output, base_dir, stats, analysis, every)
            finally:
                for path in inputs:
                    close_data_file(path)  # none of the input's files held open after
            report = build_report(analysis, stats)
            report.bytes_before = sum(path.stat().st_size for path in inputs if path.is_file())
            report.bytes_after = written
            result = output
        else:
            report = build_report(analysis, stats)
            report.bytes_before, report.bytes_after = bytes_before, proto.ByteSize()
            if kind == "ir":
                import onnx_ir as ir

                result = ir.serde.deserialize_model(proto)
            else:
                result = proto
    report.validation = validation
    report.seconds = time.perf_counter() - started
    spent.update(analysis.seconds)
    spent[_LOAD] += loaded - started  # type: ignore[assignment]
    spent[_SAVE] += time.perf_counter() - saving - analysis.seconds.get(_SETTLE, 0.0)  # type: ignore[assignment]
    report.stages = _stages(spent)
    return result, report


_SETTLE = "MeasureRanges (settled)"
_LOAD, _SAVE = "load", "save"


def _save(proto: onnx.ModelProto, source, output, base_dir: str | None, stats, analysis: Analysis,
          measurement: ranges.Measurement | None) -> int | None:
    """The model written, then committed once the range check that was still measuring when the
    conversion went on (``analysis.pending``) is settled by ``measurement`` and changes nothing
    (its wait timed as part of the range check); None, nothing written, where it keeps nodes
    float32."""
    with io.writing(proto, output, base_dir, stats.deferred, source) as written:
        if analysis.pending is not None:
            assert measurement is not None  # the range check defers only where a measurement runs
            waiting = time.perf_counter()
            try:
                settled = MeasureRanges.settle(analysis, measurement.result())
            finally:
                analysis.seconds[_SETTLE] = time.perf_counter() - waiting
            if not settled:
                return None
        written.commit()
    return written.size


def _stages(steps: Counter[str]) -> dict[str, float]:
    """The report's breakdown: the steps (loads, passes, saves) grouped as load, analysis,
    range check, rewrite and save."""
    special = {_LOAD: "load", _SAVE: "save", "MeasureRanges": "range check", _SETTLE: "range check",
               "InsertCasts": "rewrite", "SeparateNormCasts": "rewrite", "DeclareInferredShapes": "rewrite"}
    stages = {"load": 0.0, "analysis": 0.0, "range check": 0.0, "rewrite": 0.0, "save": 0.0}
    for step, seconds in steps.items():
        stages[special.get(step, "analysis")] += seconds
    # rounded down: rounded to nearest, five stages could add up to more than the wall time
    return {name: math.floor(seconds * 1e4) / 1e4 for name, seconds in stages.items()}


def _load(model, output) -> tuple[onnx.ModelProto, str | None, str]:
    if isinstance(model, (str, os.PathLike)):
        if output is None:
            raise UserError("an output path is required when the input is a path")
        io.check_output_path(model, output)
    elif output is not None:
        raise UserError("output= is only for path inputs; in-memory models are returned")
    return io.read_model(model, "convert", borrow=io.EXTERNAL_THRESHOLD)


def _declare_ir_version(proto: onnx.ModelProto, analysis: Analysis) -> None:
    """The output's IR version: the input's, or ``options.ir_version`` where the model's opsets
    allow it; the report notes where ONNX Runtime ran the model declared at an older one."""
    asked = analysis.options.output.ir_version
    if asked is not None and asked != proto.ir_version:
        needed = max(ir_versions.needed_ir_version(proto), 4 if proto.ir_version >= 4 else 3)
        if asked < needed:
            raise UserError(f"--ir-version {asked}: the model needs IR version {needed} at least (its opsets; "
                            f"below 4, initializers must be listed as graph inputs)")
        proto.ir_version = asked
        return
    if (ran := instrument.ir_version_note(proto)) and not any(ran in note for note in analysis.notes):
        analysis.notes.append(f"note: {ran}; the output keeps IR version {proto.ir_version} "
                              f"(--ir-version {instrument.readable_ir_version()} writes one that runtime loads)")


def _input_files(path, tensors: Iterable[onnx.TensorProto]) -> list[Path]:
    """The model file at ``path``, then the external data files that ``tensors`` name (the model
    file itself, for the tensors borrowed from it, once)."""
    path = Path(path)
    files = {location for t in tensors if (location := data_file(t))} - {path.name}
    return [path, *(path.parent / f for f in sorted(files))]
