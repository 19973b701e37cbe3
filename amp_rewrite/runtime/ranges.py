"""Measuring value ranges: a runtime stage that runs the float32 model on data and returns a
table, the statistics of each value by key (``Table``). What the statistics mean for precision is
judged elsewhere (the rewrite's MeasureRanges, which imports nothing from here: a ``Meter`` is what
the callers above both hand it): this module only measures, and a measurement that fails says so as
data (``Table.failure``), not as the exception it raised.

``start`` begins a measurement of every float value in a child process (``isolate``) that runs
beside the caller's analysis; ``measure`` measures the values asked for, now, in a child. The
data are drawn in the caller before any child starts: data that cannot be made is the error to
report, not a crash to isolate. Generated data come as candidate sets (``samples.attempts``),
the first the model runs on measured.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import onnx

from amp_rewrite.errors import UserError
from amp_rewrite.inputs import samples
from amp_rewrite.ir.graph import ValueKey
from amp_rewrite.ir.measurements import Failure, PackedStats, Table, Thresholds
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import value_bytes
from amp_rewrite.policy.oplists import SAME_ELEMENTS, op_key
from amp_rewrite.runtime import expose, instrument, isolate, stages
from amp_rewrite.runtime.isolate import Hung, NativeFailure, Progress, Stalled, Started

PORTABLE_NODES = 2000
PORTABLE_BYTES = 16 << 20
"""Models up to this many top-level nodes and weight bytes are measured in the process's worker
(``isolate``; they are pickled to it, in milliseconds) rather than in a child forked for them."""


@dataclass(frozen=True)
class Source:
    """What values are measured on: ``given`` samples (.npz paths or dicts of arrays) where there
    are any, else inputs generated with ``shapes`` and ``seed``; ``precision`` sets the thresholds
    the statistics count elements below."""

    given: Sequence = ()
    shapes: Mapping[str, Sequence[int]] | None = None
    seed: int = 0
    precision: Precision = Precision.FLOAT16

    @classmethod
    def of(cls, options) -> Source:
        """``options`` (the rewrite's ``MeasurementOptions``, read by name: this layer is beneath
        it): the calibration data where there are any, else the given inputs, else generated ones."""
        return cls(options.calibrate or options.inputs, options.shapes, options.seed, options.precision)


class Meter:
    """Measures models' values on ``source``: what the callers of the rewrite's range check measure
    with, handing it the tables (``measuring.Ranges``) it judges."""

    def __init__(self, source: Source, base_dir) -> None:
        self.source, self.base_dir = source, base_dir

    @classmethod
    def of(cls, options, base_dir) -> Meter:
        return cls(Source.of(options), base_dir)

    def start(self, model: onnx.ModelProto) -> Measurement | None:
        """``start``: every float value of ``model``, measured beside the caller."""
        return start(model, self.source, self.base_dir)

    @contextlib.contextmanager
    def beside(self, model: onnx.ModelProto, wanted: bool) -> Iterator[Measurement | None]:
        """Every float value of ``model`` measured beside the block, where ``wanted`` (the range
        check runs on it) and a child can be had; stopped at the block's end if still running."""
        measurement = self.start(model) if wanted else None
        try:
            yield measurement
        finally:
            if measurement is not None:
                measurement.close()

    def measure(self, model: onnx.ModelProto, keys: list[ValueKey]) -> Table:
        """``measure``: ``keys`` measured now; where that fails, a table that says why."""
        try:
            return measure(model, self.source, self.base_dir, keys)
        except Exception as exc:  # a model ORT can't run is still converted, and says so loudly
            return failed(exc, _opset_floor(model))


def failed(exc: Exception, opset_floor: int | None) -> Table:
    """The table of a measurement that raised ``exc``: what the report says of it."""
    inputs = isinstance(exc, UserError) and not isinstance(exc, NativeFailure)  # the data were not made
    reason = str(exc) if inputs else instrument.first_line(exc, limit=200)
    return Table("", {}, failure=Failure(reason, inputs, opset_floor))


def _opset_floor(model: onnx.ModelProto) -> int | None:
    return instrument.ORT_MIN_OPSET if instrument.runnable(model) is model else None


def start(model: onnx.ModelProto, source: Source, base_dir) -> Measurement | None:
    """Start measuring every float value of ``model`` beside the caller (None where no child can
    be had: ``measure`` then runs in the caller, and says so)."""
    if isolate.in_process():
        return None
    portable = (len(model.graph.node) <= PORTABLE_NODES and not source.given
                and sum(value_bytes(t) for g in iter_graphs(model.graph) for t in g.initializer) <= PORTABLE_BYTES)
    started = Started(functools.partial(_measure_every_value, model, source, base_dir),
                      "onnxruntime (range check)", portable=portable)
    return Measurement(started, _opset_floor(model))


def measure(model: onnx.ModelProto, source: Source, base_dir, keys: list[ValueKey]) -> Table:
    """The statistics of ``keys``, measured now in a child process, stage by stage (``stages``)."""
    description, stats = isolate.isolated(_work(model, source, base_dir, keys), "onnxruntime (range check)")
    return Table(description, stats, isolate.in_process())


class Measurement:
    """The measurement of every float value that ``start`` began."""

    def __init__(self, started: Started, opset_floor: int | None) -> None:
        self._started: Started | None = started
        self._found: Table | None = None
        self._opset_floor = opset_floor
        """The model's ``Failure.opset_floor``, for a hang."""

    def result(self) -> Table | None:
        """The table, or None where it failed: the values a caller watches may run where every
        value did not, and a child that deadlocked (``Stalled``) was not the model's doing. A
        hang past the time limit is a table that says so (``failure``), each time: measuring
        again would hang again."""
        if self._started is not None:
            started, self._started = self._started, None
            try:
                description, stats = started.result()
                self._found = Table(description, stats, isolate.in_process())
            except Stalled:
                self._found = None
            except Hung as hung:
                self._found = failed(hung, self._opset_floor)
            except Exception:  # measured again, the watched values alone
                self._found = None
        return self._found

    def close(self) -> None:
        """Stop the measurement if it still runs (its result is no longer wanted)."""
        if self._started is not None:
            self._started.close()
            self._started = None


def _work(model: onnx.ModelProto, source: Source, base_dir, keys: list[ValueKey] | None,
          threads: int = 0) -> Callable[[Progress], tuple[str, PackedStats]]:
    """The measurement of ``keys`` (None: every float value) on ``source``, for a child process:
    (what extents generated inputs took, statistics by value key). The data are drawn here,
    before any session: data that cannot be made is the error to report."""
    given = samples.resolve(source.given, model)
    candidates = (iter([samples.Attempt("", given)]) if given
                  else samples.attempts(model, source.shapes, source.seed, implied_first=False))
    first = next(candidates)
    thresholds = Thresholds.of(source.precision)
    top = _computed_top_level(model) if keys is None else {name: (graph, name) for graph, name in keys if graph == 0}

    def work(progress: Progress) -> tuple[str, PackedStats]:
        # a copy where the work runs in this process: the Sigmoids are made exact in place
        lifted = expose.lift_nested(instrument.runnable(model), keys, thresholds,
                                        copy=bool(isolate.in_process()))
        expose.exact_sigmoid(lifted.model)
        return samples.first_that_runs(
            itertools.chain([first], candidates),
            lambda data: PackedStats(stages.measure(lifted.model, top, lifted.stats, data, thresholds,
                                                    base_dir, progress, threads)))

    return work


def _measure_every_value(model: onnx.ModelProto, source: Source, base_dir,
                         progress: Progress) -> tuple[str, PackedStats]:
    """``start``'s work (a function of its arguments alone, so that it pickles to the worker)."""
    return _work(model, source, base_dir, None, threads=1)(progress)


def _computed_top_level(model: onnx.ModelProto) -> dict[str, ValueKey]:
    """The values that top-level nodes compute, less those whose elements a ``SAME_ELEMENTS``
    node takes from another of them (the judge reads that one's statistics for them)."""
    computed: dict[str, ValueKey] = {}
    made: set[str] = set()
    for node in model.graph.node:
        same = op_key(node.domain, node.op_type) in SAME_ELEMENTS and node.input and node.input[0] in made
        for name in node.output:
            if name:
                made.add(name)
                if not same:
                    computed[name] = (0, name)
    return computed
