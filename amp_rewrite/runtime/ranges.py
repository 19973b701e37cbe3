"""Measuring value ranges: a runtime stage that runs the float32 model on data and returns a
table, the statistics of each value by key (``Table``). What the statistics mean for precision is
judged elsewhere (the rewrite's MeasureRanges): this module only measures.

``start`` begins a measurement of every float value in a child process (``isolate``) that runs
beside the caller's analysis; ``measure`` measures the values asked for, now, in a child. The
data are drawn in the caller before any child starts: data that cannot be made is the error to
report, not a crash to isolate. Generated data come as candidate sets (``samples.attempts``),
the first the model runs on measured.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import onnx

from amp_rewrite.inputs import samples
from amp_rewrite.ir.graph import ValueKey
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import value_bytes
from amp_rewrite.policy.oplists import SAME_ELEMENTS, op_key
from amp_rewrite.runtime import expose, instrument, isolate, stages
from amp_rewrite.runtime.isolate import Hung, Progress, Stalled, Started

PORTABLE_NODES = 2000
PORTABLE_BYTES = 16 << 20
"""Models up to this many top-level nodes and weight bytes are measured in the process's worker
(``isolate``; they are pickled to it, in milliseconds) rather than in a child forked for them."""


class Table(NamedTuple):
    """What a measurement found: the extents generated inputs took (empty for given data), and
    the statistics of each measured value by key."""

    description: str
    stats: expose.StatsByKey


@dataclass(frozen=True)
class Source:
    """What values are measured on: ``given`` samples (.npz paths or dicts of arrays) where there
    are any, else inputs generated with ``shapes`` and ``seed``; ``precision`` sets the thresholds
    the statistics count elements below."""

    given: Sequence = ()
    shapes: Mapping[str, Sequence[int]] | None = None
    seed: int = 0
    precision: Precision = Precision.FLOAT16


def start(model: onnx.ModelProto, source: Source, base_dir) -> Measurement | None:
    """Start measuring every float value of ``model`` beside the caller (None where no child can
    be had: ``measure`` then runs in the caller, and says so)."""
    if isolate.in_process():
        return None
    portable = (len(model.graph.node) <= PORTABLE_NODES and not source.given
                and sum(value_bytes(t) for g in iter_graphs(model.graph) for t in g.initializer) <= PORTABLE_BYTES)
    return Measurement(Started(functools.partial(_measure_every_value, model, source, base_dir),
                               "onnxruntime (range check)", portable=portable))


def measure(model: onnx.ModelProto, source: Source, base_dir, keys: list[ValueKey]) -> Table:
    """The statistics of ``keys``, measured now in a child process, stage by stage (``stages``)."""
    return Table(*isolate.isolated(_work(model, source, base_dir, keys), "onnxruntime (range check)"))


class Measurement:
    """The measurement of every float value that ``start`` began."""

    def __init__(self, started: Started) -> None:
        self._started: Started | None = started
        self._found: Table | None = None
        self._hung: Hung | None = None

    def result(self) -> Table | None:
        """The table, or None where it failed: the values a caller watches may run where every
        value did not, and a child that deadlocked (``Stalled``) was not the model's doing. A
        hang past the time limit is raised, each time: measuring again would hang again."""
        if self._started is not None:
            started, self._started = self._started, None
            try:
                self._found = Table(*started.result())
            except Stalled:
                self._found = None
            except Hung as hung:
                self._hung = hung
            except Exception:  # measured again, the watched values alone
                self._found = None
        if self._hung is not None:
            raise self._hung
        return self._found

    def close(self) -> None:
        """Stop the measurement if it still runs (its result is no longer wanted)."""
        if self._started is not None:
            self._started.close()
            self._started = None


def _work(model: onnx.ModelProto, source: Source, base_dir, keys: list[ValueKey] | None,
          threads: int = 0) -> Callable[[Progress], tuple[str, expose.PackedStats]]:
    """The measurement of ``keys`` (None: every float value) on ``source``, for a child process:
    (what extents generated inputs took, statistics by value key). The data are drawn here,
    before any session: data that cannot be made is the error to report."""
    given = samples.resolve(source.given, model)
    candidates = (iter([samples.Attempt("", given)]) if given
                  else samples.attempts(model, source.shapes, source.seed, implied_first=False))
    first = next(candidates)
    thresholds = expose.Thresholds.of(source.precision)
    top = _computed_top_level(model) if keys is None else {name: (graph, name) for graph, name in keys if graph == 0}

    def work(progress: Progress) -> tuple[str, expose.PackedStats]:
        # a copy where the work runs in this process: the Sigmoids are made exact in place
        lifted = expose.lift_nested(instrument.runnable(model), keys, thresholds,
                                        copy=bool(isolate.in_process()))
        expose.exact_sigmoid(lifted.model)
        return samples.first_that_runs(
            itertools.chain([first], candidates),
            lambda data: expose.PackedStats(stages.measure(lifted.model, top, lifted.stats, data, thresholds,
                                                               base_dir, progress, threads)))

    return work


def _measure_every_value(model: onnx.ModelProto, source: Source, base_dir,
                         progress: Progress) -> tuple[str, expose.PackedStats]:
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
